package discovery

import (
	"strings"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Component names a Kubernetes component that Talos runs on a node.
type Component = render.Component

// The components discovery knows, in the order plans list them.
const (
	APIServer         = render.APIServer
	ControllerManager = render.ControllerManager
	Scheduler         = render.Scheduler
	KubeProxy         = render.KubeProxy
	Kubelet           = render.Kubelet
)

// Components lists every Component in plan order.
func Components() []Component {
	return render.Components()
}

// StaticPodComponents are the components Talos runs as static pods on control planes.
func StaticPodComponents() []Component {
	return []Component{APIServer, ControllerManager, Scheduler}
}

// Labels and annotations discovery reads.
const (
	// ControlPlaneLabel marks a control-plane Node.
	ControlPlaneLabel = "node-role.kubernetes.io/control-plane"
	// HoldAnnotation on a Node excludes it from every upgrade; its value is shown as the reason.
	HoldAnnotation = "ichor.dev/hold"
	// OrderLabel on a Node (an integer) orders it within its group, ascending.
	OrderLabel = "ichor.dev/order"
	// ConfigVersionAnnotation on a mirror pod is the Talos config version it was rendered from.
	ConfigVersionAnnotation = "talos.dev/config-version"
	// ComponentLabel on a mirror pod names its component.
	ComponentLabel = "k8s-app"
	// StaticPodNamespace holds the mirror pods and kube-proxy.
	StaticPodNamespace = "kube-system"
	// KubeProxyDaemonSet is the name of the kube-proxy DaemonSet.
	KubeProxyDaemonSet = "kube-proxy"
)

// Snapshot is the cluster as discovery found it. Nodes are sorted by name.
type Snapshot struct {
	// Endpoint is the Kubernetes API server URL the snapshot was read through.
	Endpoint string
	// Nodes are every Node, sorted by name.
	Nodes []Node
	// KubeProxy is the kube-proxy DaemonSet; Present is false when kube-proxy is disabled.
	KubeProxy KubeProxyInfo
	// PDBs are every PodDisruptionBudget, sorted by namespace and name.
	PDBs []PDB
}

// Node is one Node with what the plan needs to know about it.
type Node struct {
	// Name is the Node's name.
	Name string
	// ControlPlane is true when the Node has ControlPlaneLabel.
	ControlPlane bool
	// InternalIP is the Node's InternalIP address; Talos calls go to it.
	InternalIP string
	// KubeletVersion is status.nodeInfo.kubeletVersion.
	KubeletVersion string
	// OSImage is status.nodeInfo.osImage, e.g. "Talos (v1.13.9)".
	OSImage string
	// Ready is the Node's Ready condition.
	Ready bool
	// NotReadySince is when its kubelet reported it NotReady (NotReadySince);
	// zero when it does not.
	NotReadySince time.Time
	// Unschedulable is spec.unschedulable (cordoned).
	Unschedulable bool
	// Held is true when the Node has HoldAnnotation.
	Held bool
	// HoldReason is the value of HoldAnnotation.
	HoldReason string
	// Order is the raw value of OrderLabel, "" when absent.
	Order string
	// Labels are the Node's labels, for the drain preview's scheduling rules.
	Labels map[string]string
	// Taints are the Node's taints, for the drain preview's scheduling rules.
	Taints []corev1.Taint
	// StaticPods are the node's control-plane mirror pods by component.
	StaticPods map[Component]StaticPod
	// Talos is what the Talos API says about the node; nil for a node that is not Talos.
	Talos *Talos
}

// IsTalos reports whether the Node's OS image is Talos.
func (n Node) IsTalos() bool {
	return strings.HasPrefix(n.OSImage, "Talos")
}

// Address is where the node's Talos API is reached: its InternalIP.
func (n Node) Address() string { return n.InternalIP }

// Role is "control-plane" or "worker".
func (n Node) Role() string {
	if n.ControlPlane {
		return "control-plane"
	}

	return "worker"
}

// StaticPod is a control-plane mirror pod.
type StaticPod struct {
	// Name is the mirror pod's name.
	Name string
	// Image is its container's image.
	Image string
	// Ready is its Ready condition.
	Ready bool
	// ConfigVersion is its ConfigVersionAnnotation.
	ConfigVersion string
}

// Talos is a node's Talos version and active machine config.
type Talos struct {
	// Version is the Talos version the node runs, e.g. "v1.13.9".
	Version string
	// Images are the component images in the active machine config, only those the node
	// runs (render.Images): a worker has only the kubelet.
	Images map[Component]string
	// Layouts says where the config keeps each image in Images: the v1alpha1
	// fields or the component's own document (render.Layouts).
	Layouts map[Component]render.Layout
	// InstallImage is the installer the config names: the
	// UnattendedInstallConfig document's installer.image on a config that has
	// one (Talos 1.14), else machine.install.image.
	InstallImage string
	// Installed is what the node's Talos was installed with (platform,
	// SecureBoot, system extensions and schematic); nil when not read
	// (Discoverer.Installed unset).
	Installed *talos.Installed
	// Staged says where the node's persistent machine config differs from its active
	// one (render.Staged): a change staged for the next reboot; "" when none, or when
	// not read (StagedRead false: Discoverer.Persistent unset).
	Staged     string
	StagedRead bool
	// KubeProxyEnabled is false when kube-proxy is disabled
	// (cluster.proxy.disabled, or KubeProxyConfig enabled: false).
	KubeProxyEnabled bool
	// APIAccess is the Talos API access from Kubernetes the config allows.
	APIAccess TalosAPIAccess
	// Config is the active machine config itself, for the engine's renders.
	Config config.Provider
}

// TalosAPIAccess is the Talos API access from Kubernetes a config allows:
// machine.features.kubernetesTalosAPIAccess, or Talos 1.14's
// KubeTalosAPIAccessConfig document.
type TalosAPIAccess struct {
	// Enabled is the feature switch (the document's presence).
	Enabled bool
	// Document is true when the config keeps the setting in a
	// KubeTalosAPIAccessConfig document, or has neither form and takes the
	// Talos 1.14 documents (a patch should add the document then).
	Document bool
	// AllowedRoles are the Talos roles pods may be granted.
	AllowedRoles []string
	// AllowedNamespaces are the namespaces whose pods may be granted them.
	AllowedNamespaces []string
}

// KubeProxyInfo is the kube-proxy DaemonSet.
type KubeProxyInfo struct {
	// Present is false when there is no kube-proxy DaemonSet (kube-proxy disabled).
	Present bool
	// Image is the DaemonSet's kube-proxy container image.
	Image string
	// Desired is status.desiredNumberScheduled.
	Desired int32
	// Ready is status.numberReady.
	Ready int32
	// MaxUnavailable is how many pods its rolling update replaces at once
	// (DaemonSetMaxUnavailable).
	MaxUnavailable int
}

// PDB is a PodDisruptionBudget's status.
type PDB struct {
	// Namespace is the PDB's namespace.
	Namespace string
	// Name is the PDB's name.
	Name string
	// DisruptionsAllowed is status.disruptionsAllowed.
	DisruptionsAllowed int32
	// ExpectedPods is status.expectedPods.
	ExpectedPods int32
	// Selector is spec.selector; a nil selector selects no pod, as in policy/v1.
	Selector *metav1.LabelSelector
}

// ControlPlanes returns the control-plane nodes, by name.
func (s *Snapshot) ControlPlanes() []Node {
	var out []Node

	for _, n := range s.Nodes {
		if n.ControlPlane {
			out = append(out, n)
		}
	}

	return out
}

// Node returns the node with the given name.
func (s *Snapshot) Node(name string) (Node, bool) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n, true
		}
	}

	return Node{}, false
}
