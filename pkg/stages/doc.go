// Package stages owns the shape of an upgrade, as a pure model: what is to happen, never
// the doing of it (that is pkg/engine, which this package does not import).
//
//   - The stages, an ordered list of small types: APIServers, ControlPlaneComponents,
//     KubeProxy, Kubelets for Kubernetes (kubernetes.go); TalosOS for the OS (talos.go).
//     Each says of itself what the run needs to know: which components it sets to the
//     target (AtTarget; the others are pinned to the node's kubelet version, never
//     moved back), whether it visits workers, whether it drains its nodes (Drains), what
//     it rolls out besides the configs (Rollout: the kube-proxy DaemonSet), what its
//     batches wait for (Work, which paces estimates). The engine asks these, not which
//     stage it has.
//   - The order nodes are visited in (order.go): held nodes (discovery.HoldAnnotation)
//     left out and named, control planes one at a time, workers in batches of
//     MaxUnavailable, the order label first, the runner's own node last in its group.
//   - What each stage changes on each node (KubernetesChanges, TalosOS.Changes) and the
//     config and bootstrap manifests its render gives (render.go: RenderStage,
//     ManifestsAtTarget), which plan shows and the run applies.
//   - The version rules (version.go): strict vX.Y.Z, one minor at a time, no downgrade;
//     an image whose tag says no version moves nothing (ErrNoVersionTag).
//   - The invariant (invariant.go): no kube-controller-manager, kube-scheduler,
//     kube-proxy or kubelet newer than any kube-apiserver, judged from what the cluster
//     runs, with the lines that say what is skewed or unknown.
//   - etcd's health (etcd.go): read through the EtcdReader a caller passes, judged per
//     member (voters, quorum, raft progress, alarms) for the checks and the Talos gate.
//
// The plan side reads a discovery.Snapshot and returns the plan's stages as the
// api/v1alpha1 types; the engine runs the same functions on what it reads, so the plan
// command and the in-cluster run derive the same answer from the same observed state.
//
// The installer of each node (installer.go) is chosen from what the node runs, not
// from its config alone: a node moved to an Image Factory schematic usually still
// names the plain installer, which would drop its system extensions, and from Talos
// 1.14 the plain installer is not published at all. ChooseInstaller keeps the
// schematic (its factory installer at the target), keeps a configured installer that
// already is that schematic's, gives a node that runs nothing Talos 1.14's default (the
// factory installer of the empty schematic), checks an explicit installer
// (--installer-image) against what the node runs (--drop-extensions, per node, accepts
// a loss), and refuses, naming the --installer-image to pass, what it cannot derive; the
// plan and the engine use the same rule, and InstallExpect is what the node must run
// after its reboot.
package stages
