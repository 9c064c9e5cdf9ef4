// Package discoverytest builds fake clusters for tests: the Kubernetes objects a fake
// clientset serves, a fake Talos reader with a machine config per node, and the Snapshot
// discovery reads from them.
package discoverytest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Endpoint is the API server URL fake clusters are discovered through.
const Endpoint = "https://192.168.0.100:6443"

// Cluster builds a fake cluster.
type Cluster struct {
	nodes     []*NodeSpec
	kubeProxy bool
	pdbs      []policyv1.PodDisruptionBudget
	pods      []*corev1.Pod
	ds        []string
}

// NodeSpec is one fake node; set its fields to vary it from the defaults.
type NodeSpec struct {
	// Name is the Node's name.
	Name string
	// IP is its InternalIP.
	IP string
	// ControlPlane makes it a control plane.
	ControlPlane bool
	// Kubernetes is the version every component runs, e.g. "v1.35.4".
	Kubernetes string
	// Versions overrides the version of single components.
	Versions map[discovery.Component]string
	// Registry is the image registry prefix, e.g. "registry.k8s.io".
	Registry string
	// KubeletRepository is the kubelet image's repository; "" is Talos' own,
	// ghcr.io/siderolabs/kubelet.
	KubeletRepository string
	// Talos is the Talos version, e.g. "v1.13.9".
	Talos string
	// OSImage overrides the Node's osImage (a node that is not Talos).
	OSImage string
	// NotReady marks the Node NotReady.
	NotReady bool
	// NotReadySince, with NotReady, is when its Ready condition turned False (a
	// node still starting, when recent); zero: long ago.
	NotReadySince time.Time
	// Cordoned sets spec.unschedulable.
	Cordoned bool
	// Hold, when not nil, sets the hold annotation to its value.
	Hold *string
	// Order sets the order label.
	Order string
	// APIAccess is machine.features.kubernetesTalosAPIAccess.
	APIAccess *v1alpha1.KubernetesTalosAPIAccessConfig
	// ProxyDisabled sets cluster.proxy.disabled.
	ProxyDisabled bool
	// Labels are added to the Node's labels.
	Labels map[string]string
	// Taints are the Node's taints.
	Taints []corev1.Taint
	// Installed is what its Talos reports it was installed with; nil: the
	// metal platform, no system extensions.
	Installed *talos.Installed
}

// New returns an empty cluster with the kube-proxy DaemonSet.
func New() *Cluster { return &Cluster{kubeProxy: true} }

// ThreePlusTwo returns the standard fixture: cp-1..cp-3 and worker-1, worker-2, all at
// Kubernetes v1.35.4 and Talos v1.13.9, Talos API access allowed in ichor-system.
func ThreePlusTwo() *Cluster {
	c := New()
	for i := 1; i <= 3; i++ {
		c.ControlPlane(fmt.Sprintf("cp-%d", i), fmt.Sprintf("10.0.0.1%d", i))
	}

	for i := 1; i <= 2; i++ {
		c.Worker(fmt.Sprintf("worker-%d", i), fmt.Sprintf("10.0.0.2%d", i))
	}

	return c
}

func (c *Cluster) add(name, ip string, cp bool) *NodeSpec {
	n := &NodeSpec{
		Name: name, IP: ip, ControlPlane: cp, Kubernetes: "v1.35.4", Registry: "registry.k8s.io", Talos: "v1.13.9",
		APIAccess: &v1alpha1.KubernetesTalosAPIAccessConfig{
			AccessEnabled:                     Ptr(true),
			AccessAllowedRoles:                []string{"os:admin"},
			AccessAllowedKubernetesNamespaces: []string{"ichor-system"},
		},
	}
	c.nodes = append(c.nodes, n)

	return n
}

// ControlPlane adds a control plane with the defaults and returns it for changes.
func (c *Cluster) ControlPlane(name, ip string) *NodeSpec { return c.add(name, ip, true) }

// Worker adds a worker with the defaults and returns it for changes.
func (c *Cluster) Worker(name, ip string) *NodeSpec { return c.add(name, ip, false) }

// Node returns the node named name; it panics when there is none.
func (c *Cluster) Node(name string) *NodeSpec {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}

	panic("discoverytest: no node " + name)
}

// WithoutKubeProxy removes the kube-proxy DaemonSet.
func (c *Cluster) WithoutKubeProxy() *Cluster {
	c.kubeProxy = false

	return c
}

// PDB adds a PodDisruptionBudget with the given status.
func (c *Cluster) PDB(namespace, name string, allowed, expected int32) *Cluster {
	c.pdbs = append(c.pdbs, policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, ExpectedPods: expected},
	})

	return c
}

// PDBFor adds a PodDisruptionBudget selecting the pods with matchLabels in
// namespace, with the given status.
func (c *Cluster) PDBFor(namespace, name string, allowed, expected int32, matchLabels map[string]string) *Cluster {
	c.pdbs = append(c.pdbs, policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: matchLabels}},
		Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed, ExpectedPods: expected},
	})

	return c
}

// Pod adds a running pod named namespace/name on node, with labels app=<name>;
// owner, when not empty, is its controller: "ReplicaSet/web-1" or
// "DaemonSet/agent" (the DaemonSet is added too). Change the returned pod
// to vary it (volumes, node selector, tolerations).
func (c *Cluster) Pod(node, namespace, name, owner string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(namespace + "/" + name),
			Labels: map[string]string{"app": name}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}

	if kind, ownerName, found := strings.Cut(owner, "/"); found {
		p.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: kind, Name: ownerName, UID: types.UID(namespace + "/" + owner), Controller: Ptr(true),
		}}

		if kind == "DaemonSet" {
			c.ds = append(c.ds, namespace+"/"+ownerName)
		}
	}

	c.pods = append(c.pods, p)

	return p
}

func (n *NodeSpec) version(c discovery.Component) string {
	if v, found := n.Versions[c]; found {
		return v
	}

	return n.Kubernetes
}

func (n *NodeSpec) image(c discovery.Component) string {
	if c == discovery.Kubelet {
		repo := n.KubeletRepository
		if repo == "" {
			repo = "ghcr.io/siderolabs/kubelet"
		}

		return fmt.Sprintf("%s:%s", repo, n.version(c))
	}

	return fmt.Sprintf("%s/%s:%s", n.Registry, c, n.version(c))
}

// Objects returns the Kubernetes objects of the cluster: Nodes, mirror pods, the
// kube-proxy DaemonSet and PDBs.
func (c *Cluster) Objects() []runtime.Object {
	var objs []runtime.Object

	for _, n := range c.nodes {
		objs = append(objs, n.node())

		if n.ControlPlane {
			for _, comp := range discovery.StaticPodComponents() {
				objs = append(objs, n.mirrorPod(comp))
			}
		}
	}

	if c.kubeProxy {
		objs = append(objs, &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:v1.35.4"}},
			}}},
			Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: int32(len(c.nodes)), NumberReady: int32(len(c.nodes))},
		})
	}

	for i := range c.pdbs {
		objs = append(objs, &c.pdbs[i])
	}

	for _, p := range c.pods {
		objs = append(objs, p)
	}

	for _, key := range c.ds {
		ns, name, _ := strings.Cut(key, "/")
		objs = append(objs, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}

	return objs
}

func (n *NodeSpec) node() *corev1.Node {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec:       corev1.NodeSpec{Unschedulable: n.Cordoned},
		Status: corev1.NodeStatus{
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: n.Name}, {Type: corev1.NodeInternalIP, Address: n.IP}},
			NodeInfo:   corev1.NodeSystemInfo{KubeletVersion: n.version(discovery.Kubelet), OSImage: fmt.Sprintf("Talos (%s)", n.Talos)},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}

	if n.NotReady {
		node.Status.Conditions[0].Status = corev1.ConditionFalse
		node.Status.Conditions[0].LastTransitionTime = metav1.NewTime(n.NotReadySince)
	}

	if n.OSImage != "" {
		node.Status.NodeInfo.OSImage = n.OSImage
	}

	if n.ControlPlane {
		node.Labels[discovery.ControlPlaneLabel] = ""
	}

	if n.Hold != nil {
		node.Annotations[discovery.HoldAnnotation] = *n.Hold
	}

	if n.Order != "" {
		node.Labels[discovery.OrderLabel] = n.Order
	}

	for k, v := range n.Labels {
		node.Labels[k] = v
	}

	node.Spec.Taints = n.Taints

	return node
}

func (n *NodeSpec) mirrorPod(c discovery.Component) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   "kube-system",
			Name:        fmt.Sprintf("%s-%s", c, n.Name),
			Labels:      map[string]string{discovery.ComponentLabel: string(c), "tier": "control-plane"},
			Annotations: map[string]string{discovery.ConfigVersionAnnotation: "1", corev1.MirrorPodAnnotationKey: "mirror"},
		},
		Spec: corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: string(c), Image: n.image(c)}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		}},
	}
}

// Config returns the node's machine config.
func (n *NodeSpec) Config() config.Provider {
	cfg := &v1alpha1.Config{
		ConfigVersion: "v1alpha1",
		MachineConfig: &v1alpha1.MachineConfig{
			MachineType:     "worker",
			MachineKubelet:  &v1alpha1.KubeletConfig{KubeletImage: n.image(discovery.Kubelet)},
			MachineInstall:  &v1alpha1.InstallConfig{InstallImage: "ghcr.io/siderolabs/installer:" + n.Talos},
			MachineFeatures: &v1alpha1.FeaturesConfig{KubernetesTalosAPIAccessConfig: n.APIAccess},
		},
		ClusterConfig: &v1alpha1.ClusterConfig{},
	}

	if n.ControlPlane {
		cfg.MachineConfig.MachineType = "controlplane"
		cfg.ClusterConfig.APIServerConfig = &v1alpha1.APIServerConfig{ContainerImage: n.image(discovery.APIServer)}
		cfg.ClusterConfig.ControllerManagerConfig = &v1alpha1.ControllerManagerConfig{ContainerImage: n.image(discovery.ControllerManager)}
		cfg.ClusterConfig.SchedulerConfig = &v1alpha1.SchedulerConfig{ContainerImage: n.image(discovery.Scheduler)}
		cfg.ClusterConfig.ProxyConfig = &v1alpha1.ProxyConfig{ContainerImage: n.image(discovery.KubeProxy)}

		if n.ProxyDisabled {
			cfg.ClusterConfig.ProxyConfig.Disabled = Ptr(true)
		}
	}

	return container.NewV1Alpha1(cfg)
}

// Talos returns a fake Talos reader serving every node by its IP.
func (c *Cluster) Talos() *FakeTalos {
	f := &FakeTalos{
		Versions: map[string]string{}, Configs: map[string]config.Provider{}, Errors: map[string]error{},
		Installs: map[string]talos.Installed{},
	}

	for _, n := range c.nodes {
		f.Versions[n.IP] = n.Talos
		f.Configs[n.IP] = n.Config()
		f.Installs[n.IP] = talos.Installed{Platform: "metal"}

		if n.Installed != nil {
			f.Installs[n.IP] = *n.Installed
		}
	}

	return f
}

// Clientset returns a fake clientset serving Objects.
func (c *Cluster) Clientset() *fake.Clientset {
	return fake.NewClientset(c.Objects()...)
}

// Snapshot discovers the cluster through the fakes; it fails the test on error.
func (c *Cluster) Snapshot(t testing.TB) *discovery.Snapshot {
	t.Helper()

	fake := c.Talos()
	d := &discovery.Discoverer{Kube: c.Clientset(), Endpoint: Endpoint, Talos: fake, Installed: fake}

	snap, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("discover fake cluster: %v", err)
	}

	return snap
}

// Workloads reads the cluster's pods and DaemonSets as the drain preview
// does; it fails the test on error.
func (c *Cluster) Workloads(t testing.TB) *discovery.Workloads {
	t.Helper()

	d := &discovery.Discoverer{Kube: c.Clientset(), Endpoint: Endpoint}

	w, err := d.Workloads(context.Background())
	if err != nil {
		t.Fatalf("list fake cluster's workloads: %v", err)
	}

	return w
}

// FakeTalos is a discovery.TalosReader serving fixed answers by node IP.
type FakeTalos struct {
	// Versions are the Talos versions by IP.
	Versions map[string]string
	// Configs are the machine configs by IP.
	Configs map[string]config.Provider
	// Errors, when set for an IP, are returned by every call for it.
	Errors map[string]error
	// Installs are what each node's Talos was installed with, by IP.
	Installs map[string]talos.Installed
	// ManifestObjects are the bootstrap manifests by IP.
	ManifestObjects map[string][]*unstructured.Unstructured
	// Persistent are the persistent machine configs by IP, where one differs
	// from the active config (a change staged for the next reboot); a node
	// without one keeps its active config.
	Persistent map[string]config.Provider
}

// PersistentMachineConfig implements discovery.PersistentReader.
func (f *FakeTalos) PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error) {
	if cfg, found := f.Persistent[node]; found {
		return cfg, nil
	}

	return f.MachineConfig(ctx, node)
}

// Installed implements discovery.InstalledReader.
func (f *FakeTalos) Installed(_ context.Context, node string) (talos.Installed, error) {
	if err := f.Errors[node]; err != nil {
		return talos.Installed{}, err
	}

	in, found := f.Installs[node]
	if !found {
		return talos.Installed{}, fmt.Errorf("fake talos: unknown node %s", node)
	}

	return in, nil
}

// Version implements discovery.TalosReader.
func (f *FakeTalos) Version(_ context.Context, node string) (string, error) {
	if err := f.Errors[node]; err != nil {
		return "", err
	}

	v, found := f.Versions[node]
	if !found {
		return "", fmt.Errorf("fake talos: unknown node %s", node)
	}

	return v, nil
}

// MachineConfig implements discovery.TalosReader.
func (f *FakeTalos) MachineConfig(_ context.Context, node string) (config.Provider, error) {
	if err := f.Errors[node]; err != nil {
		return nil, err
	}

	cfg, found := f.Configs[node]
	if !found {
		return nil, fmt.Errorf("fake talos: unknown node %s", node)
	}

	return cfg, nil
}

// Ptr returns a pointer to v, for NodeSpec.Hold.
func Ptr[T any](v T) *T { return &v }

// Manifests returns the node's bootstrap manifests (ManifestObjects; none by default).
func (f *FakeTalos) Manifests(_ context.Context, node string) ([]*unstructured.Unstructured, error) {
	if err := f.Errors[node]; err != nil {
		return nil, err
	}

	return f.ManifestObjects[node], nil
}
