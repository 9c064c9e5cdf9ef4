// Package planning is the plan pipeline every plan and upgrade command runs, as a library:
// Read reads the cluster through the Kubernetes and Talos APIs (the nodes, and as asked the
// system extensions, the persistent configs, a control plane's bootstrap manifests and
// etcd); the caller plans it (pkg/stages); Evaluate previews the plan's drains and runs its
// checks (pkg/checks), dry-running the bootstrap manifests at the target for a Kubernetes
// plan. It changes nothing in the cluster and prints nothing: pkg/plugin prints.
//
// A Talos client is used for the calls it can make: a wrapper (the plugin's request
// counter) says what it wraps with Unwrap, and is used only for the calls the wrapped
// client can make.
package planning
