// Package job owns what runs an upgrade inside the cluster: the Job and the
// objects it needs (ServiceAccount, least-privilege RBAC, Talos credentials),
// the state ConfigMap that records an operation and its progress, the Lease
// lock that lets one runner at a time change the cluster, the runner that
// drives the upgrade engine in the Job's pod, and the operator's controls
// over a running operation (launch, resume, abort).
//
// It prints nothing: the runner writes its progress lines to the io.Writer it
// is given, and the plugin (pkg/plugin) does all printing for the user.
//
// The state ConfigMap (ichor-state) holds one versioned document, an
// Operation (pkg/api/v1alpha1), under the binaryData key operation.json.gz,
// and the plan the operator confirmed under plan.json.gz, both gzipped JSON
// (`kubectl ichor status -o json` prints the Operation). A state written by
// hand (manifests/) gives the Operation as plain JSON under data.operation.json
// instead, until the first write. Every write goes through Store, which
// updates with the ConfigMap's resourceVersion as a precondition and re-reads
// on a conflict.
//
// The files, by what they do:
//
//   - The operator's controls, methods of Control (control.go: the handle and
//     what its jobs share): launch.go launches an operation (the namespace, the
//     state, the runner's objects, the Talos credentials, the Job); resume.go
//     starts the next attempt of a paused or stopped one; abort.go stops one
//     and uncordons what it cordoned; busy.go says whether a new operation may
//     start (one per cluster: BusyError); diagnose.go reads what is wrong with
//     an operation's Job that its state does not show; cleanup.go removes the
//     runner's credentials once the operation ended.
//   - The state: store.go reads and writes the state ConfigMap (Store);
//     encoding.go is what it holds and how (its keys, gzipped JSON, the plain
//     form written by hand, CorruptStateError); history.go keeps the last
//     ended operations in the history ConfigMap.
//   - The lock: lock.go reads, judges and releases the Lease.
//   - The runner, in the Job's pod: runner.go takes the lock and runs the
//     engine (engine.go makes it); reporter.go is the engine's Progress and
//     Memo, recording its steps in the Operation's status (SetNode, SetStep)
//     and writing them to the state; events.go mirrors them as Kubernetes
//     events.
//   - The objects: objects.go builds the runner's objects and the Job;
//     names.go names them and their labels; access.go computes the runner's
//     access to the bootstrap manifests; hosts.go says where its pod may run;
//     apply.go applies the objects (server-side); manifests.go renders them
//     as the YAML files of manifests/.
package job
