// Package job owns what runs an upgrade inside the cluster: the Job and the
// objects it needs (ServiceAccount, least-privilege RBAC, Talos credentials),
// the state ConfigMap that records an operation and its progress, the Lease
// lock that lets one runner at a time change the cluster, the runner that
// drives the upgrade engine in the Job's pod, and the operator's controls
// over a running operation (resume, abort).
//
// It prints nothing: the runner writes its progress lines to the io.Writer it
// is given, and the plugin (pkg/plugin) does all printing for the user.
//
// The state ConfigMap (ichor-state) holds one versioned document, an
// Operation (ichor.dev/v1alpha1), under the binaryData key operation.json.gz,
// and the plan the operator confirmed under plan.json.gz, both gzipped JSON
// (`kubectl ichor status -o json` prints the Operation). A state written by
// hand (manifests/) gives the Operation as plain JSON under data.operation.json
// instead, until the first write. Every write goes through Store, which
// updates with the ConfigMap's resourceVersion as a precondition and re-reads
// on a conflict.
package job
