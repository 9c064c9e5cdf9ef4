// Package kube owns the Kubernetes side of an upgrade step, as the engine
// (pkg/engine) uses it:
//
//   - Nodes: one watch of every Node for a whole runner, shared by its engine
//     runs and its events: a Node read from it costs no request, and Get never
//     answers older than the runner's own last cordon or fresh read of it;
//     EnsureCordoned writes a cordon only on the condition of the
//     resourceVersion it decided on; ReadCordon asks the API server;
//   - Cache: informers over Nodes (through Nodes), the control-plane mirror
//     pods and kube-proxy pods in kube-system, and the kube-proxy DaemonSet, with a
//     Wait that re-evaluates a condition on every change it sees (no fixed
//     polling) and gives up after a bound, saying what it still waited for;
//   - the conditions verification waits for: a node Ready on a kubelet
//     version, its static pods' mirror pods Ready on a tag, a DaemonSet
//     rolled out on a tag, and DaemonSetBlocked, whether NotReady nodes keep
//     a DaemonSet's rollout from progressing;
//   - Cordon and Uncordon (and Nodes' own, remembered), which mark the node
//     with CordonedAnnotation so that a resumed engine (or abort) knows which
//     cordon is ichor's, and Drain
//     with k8s.io/kubectl/pkg/drain (DaemonSet pods ignored, PDBs respected
//     through eviction, emptyDir data deleted, bounded);
//   - ManifestApplier: server-side apply of Talos' bootstrap manifests with
//     Talos' own field manager ("talos"), a dry run first; TakeOver, the rule
//     for whose fields it takes over (Talos' own writes, or forced); Talos'
//     inventory of the manifests kept as Talos' own pass keeps it;
//   - Observe: what the cluster runs (mirror pods, kube-proxy pods, kubelets),
//     for the engine's invariant check; Observer shares one such read among the
//     callers that read at the same time, none older than its caller's call;
//   - Retry of what is temporary (an apiserver restarting) with a bound.
//
// Nothing here decides policy (which version a component should run, what
// order nodes go in); that is pkg/stages, and running it is pkg/engine.
package kube
