package v1alpha1

// APIVersion is the apiVersion of every document in this package.
const APIVersion = "ichor.dev/v1alpha1"

// KindPlan is the kind of the Plan document.
const KindPlan = "Plan"

// Upgrade kinds a Plan can describe.
const (
	// UpgradeKubernetes moves the Kubernetes components (static pods, kube-proxy, kubelets).
	UpgradeKubernetes = "kubernetes"
	// UpgradeTalos moves the Talos OS of every node.
	UpgradeTalos = "talos"
	// UpgradeCluster is an operation that runs a path: Kubernetes and Talos upgrades
	// (hops) one after another (an Operation's spec.upgrade; no Plan is of it).
	UpgradeCluster = "cluster"
)

// Check results.
const (
	// ResultOK means the check passed.
	ResultOK = "OK"
	// ResultWarn means the plan can run but the operator should read the detail.
	ResultWarn = "WARN"
	// ResultRefused means the plan cannot run until the detail is addressed.
	ResultRefused = "REFUSED"
)

// Node roles.
const (
	// RoleControlPlane is a node labelled node-role.kubernetes.io/control-plane.
	RoleControlPlane = "control-plane"
	// RoleWorker is any other node.
	RoleWorker = "worker"
)

// Plan is what `kubectl ichor plan` prints: the cluster as found, the stages in
// execution order with every node's changes, and the checks.
type Plan struct {
	// APIVersion is always APIVersion.
	APIVersion string `json:"apiVersion"`
	// Kind is always KindPlan.
	Kind string `json:"kind"`
	// Upgrade is UpgradeKubernetes or UpgradeTalos.
	Upgrade string `json:"upgrade"`
	// Target is the version asked for, vX.Y.Z.
	Target string `json:"target"`
	// MaxUnavailable is how many workers move at once.
	MaxUnavailable int `json:"maxUnavailable"`
	// Cluster summarises the cluster the plan was made for.
	Cluster Cluster `json:"cluster"`
	// Components lists, per component, the versions running now and the target.
	Components []Component `json:"components"`
	// Stages are executed in this order; a skipped stage stays in the list.
	Stages []Stage `json:"stages"`
	// Held are nodes excluded by the ichor.dev/hold annotation.
	Held []NodeNote `json:"held,omitempty"`
	// AtTarget are nodes that already run the target and are only verified.
	AtTarget []string `json:"atTarget,omitempty"`
	// Drains are what the plan's drains will meet: every node a stage
	// cordons and drains, in the order the stages visit them, with the pods
	// it evicts and what would block or hurt the drain.
	Drains []NodeDrain `json:"drains,omitempty"`
	// Checks are every check's outcome, in a fixed order.
	Checks []Check `json:"checks"`
	// Runnable is false when any check refused.
	Runnable bool `json:"runnable"`
}

// Cluster summarises the cluster a Plan was made for.
type Cluster struct {
	// Name is the kubeconfig cluster name, when known.
	Name string `json:"name,omitempty"`
	// Endpoint is the Kubernetes API server URL the plan was made through.
	Endpoint string `json:"endpoint,omitempty"`
	// ControlPlanes is the number of control-plane nodes.
	ControlPlanes int `json:"controlPlanes"`
	// Workers is the number of worker nodes.
	Workers int `json:"workers"`
	// Talos lists the Talos versions the nodes run, with counts.
	Talos []VersionCount `json:"talos,omitempty"`
}

// VersionCount is one distinct version and how many nodes run it.
type VersionCount struct {
	// Version is vX.Y.Z, or "unknown".
	Version string `json:"version"`
	// Count is the number of nodes running it.
	Count int `json:"count"`
}

// Component is one row of the summary table.
type Component struct {
	// Name is the component, e.g. kube-apiserver or talos.
	Name string `json:"name"`
	// Current lists the distinct versions running now, newest first.
	Current []VersionCount `json:"current"`
	// Target is the version after the upgrade.
	Target string `json:"target"`
}

// Stage is one pass over the nodes.
type Stage struct {
	// Name is the stage's name: APIServers, ControlPlaneComponents, KubeProxy, Kubelets or TalosOS.
	Name string `json:"name"`
	// Description says what the stage does.
	Description string `json:"description"`
	// Skipped is true when the stage does not run (e.g. KubeProxy with kube-proxy disabled).
	Skipped bool `json:"skipped,omitempty"`
	// SkipReason says why it is skipped.
	SkipReason string `json:"skipReason,omitempty"`
	// Nodes are visited in this order; nodes with the same Batch move together.
	Nodes []NodeStep `json:"nodes"`
	// After is what the stage does once its nodes are done, if anything.
	After string `json:"after,omitempty"`
	// Rollout is the DaemonSet rollout that follows the stage's nodes (the
	// kube-proxy DaemonSet after KubeProxy), nil for none.
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Rollout is a DaemonSet's rolling update as the plan found the DaemonSet.
type Rollout struct {
	// DaemonSet is "namespace/name".
	DaemonSet string `json:"daemonSet"`
	// Pods is the number of its pods (status.desiredNumberScheduled).
	Pods int `json:"pods"`
	// MaxUnavailable is how many it replaces at once.
	MaxUnavailable int `json:"maxUnavailable"`
}

// NodeStep is what a stage does to one node.
type NodeStep struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Role is RoleControlPlane or RoleWorker.
	Role string `json:"role"`
	// Batch numbers the group of nodes that move together, from 1.
	Batch int `json:"batch"`
	// Self is true for the node that runs the Job: it goes last in its group.
	Self bool `json:"self,omitempty"`
	// ConfigLayout is where the node's machine config keeps the Kubernetes
	// images: LayoutV1Alpha1, LayoutMultiDoc, or LayoutMixed (some of each);
	// empty when its config was not read.
	ConfigLayout string `json:"configLayout,omitempty"`
	// Changes are the images (or versions) this stage changes; empty means verify only.
	Changes []Change `json:"changes"`
	// Installed is what the node's Talos runs that its installer must keep
	// (a Talos OS upgrade plan only).
	Installed *Installed `json:"installed,omitempty"`
}

// Installed is what a node's Talos was installed with, as Talos reports it.
type Installed struct {
	// Platform is the Talos platform ("metal", "aws", ...).
	Platform string `json:"platform,omitempty"`
	// SecureBoot is true when the node booted with UEFI SecureBoot.
	SecureBoot bool `json:"secureBoot,omitempty"`
	// Schematic is the Image Factory schematic ID the node runs, "" when none.
	Schematic string `json:"schematic,omitempty"`
	// Extensions are the system extensions the node runs ("name version").
	Extensions []string `json:"extensions,omitempty"`
}

// Change is one thing a stage changes on a node.
type Change struct {
	// Component is the component changed (kube-apiserver, ..., kubelet, talos).
	Component string `json:"component"`
	// From is the image (or version) now.
	From string `json:"from"`
	// To is the image (or version) after the stage.
	To string `json:"to"`
	// Path is where the node's machine config keeps it, for an image:
	// "cluster.apiServer.image" (v1alpha1) or "KubeAPIServerConfig: image"
	// (the component's document of Talos 1.14); the change is made there.
	Path string `json:"path,omitempty"`
	// Reason says why this value, when it is not plain: for the installer,
	// where it comes from (--image, the node's config, the node's schematic).
	Reason string `json:"reason,omitempty"`
	// DroppedDigest is the digest From was pinned to that To no longer carries (a new
	// tag cannot keep the old digest): said so the user can pin the new one.
	DroppedDigest string `json:"droppedDigest,omitempty"`
}

// The config layouts of NodeStep.ConfigLayout.
const (
	// LayoutV1Alpha1: every image in the v1alpha1 document (Talos 1.13 and
	// older, and nodes upgraded from them).
	LayoutV1Alpha1 = "v1alpha1"
	// LayoutMultiDoc: every image in its component's document (KubeletConfig,
	// KubeAPIServerConfig, ...), as Talos 1.14 generates.
	LayoutMultiDoc = "multi-doc"
	// LayoutMixed: some images in each.
	LayoutMixed = "mixed"
)

// NodeNote is a node with a reason it is shown apart.
type NodeNote struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Reason says why.
	Reason string `json:"reason"`
}

// Check is one check's outcome.
type Check struct {
	// Name is the check's short name, e.g. "version skew".
	Name string `json:"name"`
	// Result is ResultOK, ResultWarn or ResultRefused.
	Result string `json:"result"`
	// Detail is one line saying what was found.
	Detail string `json:"detail"`
	// Action says what to do about it; it may span lines (a patch).
	Action string `json:"action,omitempty"`
}

// NodeDrain is the drain preview of one node: what `kubectl drain
// --ignore-daemonsets --delete-emptydir-data` (the rules of ichor's drains)
// would do there now.
type NodeDrain struct {
	// Node is the Node's name.
	Node string `json:"node"`
	// Evict is how many pods the drain evicts.
	Evict int `json:"evict"`
	// Blockers stop the drain: the upgrade would pause on this node.
	Blockers []DrainFinding `json:"blockers,omitempty"`
	// Risks do not stop the drain but hurt a workload: data lost, an
	// outage while a pod moves, a pod left Pending.
	Risks []DrainFinding `json:"risks,omitempty"`
}

// DrainFinding is one pod a drain would trip on.
type DrainFinding struct {
	// Kind is one of the Drain* kinds.
	Kind string `json:"kind"`
	// Pod is namespace/name.
	Pod string `json:"pod"`
	// Detail says what was found.
	Detail string `json:"detail"`
}

// The kinds of DrainFinding.
const (
	// DrainNoController (blocker): a pod no controller re-creates; the drain
	// refuses to delete it.
	DrainNoController = "no-controller"
	// DrainRefused (blocker): another pod the drain refuses, e.g. one whose
	// DaemonSet is gone.
	DrainRefused = "refused"
	// DrainBudget (blocker): a pod whose PodDisruptionBudget allows no
	// disruption now; its eviction is refused until the drain times out.
	DrainBudget = "budget"
	// DrainLocalData (risk): a pod with emptyDir data, deleted with it.
	DrainLocalData = "local-data"
	// DrainSingleReplica (risk): the only pod of its workload; the workload
	// is down until it runs elsewhere.
	DrainSingleReplica = "single-replica"
	// DrainNowhereToGo (risk): no other schedulable node meets the pod's
	// node selector, affinity and tolerations; it stays Pending.
	DrainNowhereToGo = "nowhere-to-go"
)
