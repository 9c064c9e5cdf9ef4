// Package stages owns the shape of an upgrade: the stages as an ordered list of small
// types (APIServers, ControlPlaneComponents, KubeProxy, Kubelets for Kubernetes; TalosOS
// for the OS), the order nodes are visited in, what each stage changes on each node, and
// the version rules (strict vX.Y.Z, one minor at a time, no downgrade).
//
// The plan side is pure: it reads a discovery.Snapshot and returns the plan's stages as
// the api/v1alpha1 types, so the plan command and the in-cluster engine derive the same
// answer from the same observed state.
//
// The Engine (engine.go is its contract with the runner; one file per upgrade kind,
// engine_kubernetes.go for Kubernetes) drives an upgrade against the cluster. It keeps
// no state of its own: every Run re-reads each node's active machine config and compares
// it with the render for the current stage; a node that differs is checked, dry-run and
// applied (NO_REBOOT, under its own deadline), one that is equal is only verified, so a
// fresh Engine on a half-done cluster finishes it without applying anything twice. After
// every apply it checks the invariant against what the cluster runs: no
// kube-controller-manager, kube-scheduler, kube-proxy or kubelet newer than any
// kube-apiserver. The Kubernetes side of each step (verification by informers, cordon
// and drain, the bootstrap manifests' server-side apply) is pkg/kube.
//
// The Talos OS upgrade (engine_talos.go) visits the nodes in the same order with the
// same checks' style: upgrade path and Kubernetes pairing (machinery's compatibility
// tables), node Ready, no staged machine config, etcd all voters on a control plane;
// then it cordons and drains the node itself (a Reboot after LifecycleService.Upgrade
// does not drain), records the node's boot ID in Memo before the Upgrade call (under
// its own deadline), gates the node again right before its Install and its Reboot
// (etcd, a staged config: engine_talos_etcd.go), and follows the reboot by that boot
// ID: unreachable is rebooting, the same ID is not yet, a new ID on the old version is
// an A/B fallback and pauses. What a run does with a node whose upgrade is under way
// is decide() (engine_talos_once.go), from the node's boot ID, version and machined's
// log of the installs of that boot: only an install of the installer chosen for the
// node is rebooted into (engine_talos_foreign.go). The node is done once Ready on the
// new osImage (and, on a control plane, etcd all voters again), and uncordoned. The
// boot ID is all it keeps: a new runner resumes a node from it and the node's state.
//
// Both upgrades end with a last look at the Nodes (left_behind.go): a node not held and
// still behind the target joined after the stages read the cluster, and pauses the run,
// named, rather than be left behind by a run that says it succeeded.
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
// plan and the engine use the same rule. The run (engine_talos_installer.go) pulls every
// node's installer of a batch before the batch's first cordon, and after each reboot
// checks the node runs what its installer was to carry.
package stages
