package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// TalosReader is the part of the Talos client discovery uses; *talos.Client satisfies it.
// node is the Node's InternalIP.
type TalosReader interface {
	// Version returns the Talos version the node runs, e.g. "v1.13.9".
	Version(ctx context.Context, node string) (string, error)
	// MachineConfig returns the node's active machine config.
	MachineConfig(ctx context.Context, node string) (config.Provider, error)
}

// InstalledReader reads what a node's Talos was installed with; *talos.Client satisfies it.
type InstalledReader interface {
	// Installed returns the node's platform, SecureBoot state and system extensions.
	Installed(ctx context.Context, node string) (talos.Installed, error)
}

// PersistentReader reads the machine config a node saved for its next boot; *talos.Client
// satisfies it.
type PersistentReader interface {
	// PersistentMachineConfig returns the persistent config, nil when the node keeps none.
	PersistentMachineConfig(ctx context.Context, node string) (config.Provider, error)
}

// DefaultConcurrency bounds the Talos calls in flight when Discoverer.Concurrency is 0.
// Each node costs two calls, proxied by the endpoint's apid, so discovery waits about
// 2 x nodes x latency / DefaultConcurrency: with 10, a 1000-node cluster at 10 ms a call
// waited 2 s before any work (BenchmarkDiscoverTalosLatency). 32 keeps that well under a
// second and far below gRPC's default of 100 concurrent streams on a connection.
const DefaultConcurrency = 32

// Discoverer reads a cluster into a Snapshot.
type Discoverer struct {
	// Kube is the Kubernetes client.
	Kube kubernetes.Interface
	// Endpoint is the Kubernetes API server URL, for the snapshot and error messages.
	Endpoint string
	// Talos reads each Talos node; nil skips the Talos part (every Node.Talos stays nil).
	Talos TalosReader
	// Installed, when set, also reads each Talos node's system extensions and
	// schematic (Node.Talos.Installed), which a Talos upgrade must keep.
	Installed InstalledReader
	// Persistent, when set, also reads each Talos node's persistent machine config and
	// says where it differs from the active one (Node.Talos.Staged): a change staged for
	// the next reboot, which a Talos upgrade's reboot would activate.
	Persistent PersistentReader
	// Concurrency bounds the Talos calls in flight; 0 means DefaultConcurrency.
	Concurrency int
	// Images extracts component images from a machine config; nil means render.Images.
	Images func(config.Provider) map[Component]string
	// Listed, when set, is called with the Nodes (a copy, without their Talos side) as
	// soon as they are listed, before any Talos call: a caller starts there what needs
	// only the Nodes, beside the Talos reads (the plan's look at etcd).
	Listed func([]Node)
}

// Discover reads the cluster. It makes four Kubernetes requests whatever the node count:
// list Nodes, list the control-plane mirror pods in kube-system, get the kube-proxy
// DaemonSet, list PodDisruptionBudgets in all namespaces.
func (d *Discoverer) Discover(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{Endpoint: d.Endpoint}

	nodes, err := d.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, kubeError(d.Endpoint, "list", "nodes", "", err)
	}

	pods, err := d.Kube.CoreV1().Pods(StaticPodNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: fmt.Sprintf("%s in (%s,%s,%s)", ComponentLabel, APIServer, ControllerManager, Scheduler),
	})
	if err != nil {
		return nil, kubeError(d.Endpoint, "list", "pods", StaticPodNamespace, err)
	}

	staticPods := staticPodsByNode(pods.Items)

	for i := range nodes.Items {
		n := NodeFrom(&nodes.Items[i])
		n.StaticPods = staticPods[n.Name]
		snap.Nodes = append(snap.Nodes, n)
	}

	sort.Slice(snap.Nodes, func(i, j int) bool { return snap.Nodes[i].Name < snap.Nodes[j].Name })

	if d.Listed != nil {
		d.Listed(slices.Clone(snap.Nodes))
	}

	ds, err := d.Kube.AppsV1().DaemonSets(StaticPodNamespace).Get(ctx, KubeProxyDaemonSet, metav1.GetOptions{})

	switch {
	case apierrors.IsNotFound(err):
		// No DaemonSet: kube-proxy is disabled (or replaced by the CNI).
	case err != nil:
		return nil, kubeError(d.Endpoint, "get", "daemonsets.apps", StaticPodNamespace, err)
	default:
		snap.KubeProxy = kubeProxyFrom(ds)
	}

	pdbs, err := d.Kube.PolicyV1().PodDisruptionBudgets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, kubeError(d.Endpoint, "list", "poddisruptionbudgets.policy", "", err)
	}

	for _, p := range pdbs.Items {
		snap.PDBs = append(snap.PDBs, PDB{
			Namespace:          p.Namespace,
			Name:               p.Name,
			DisruptionsAllowed: p.Status.DisruptionsAllowed,
			ExpectedPods:       p.Status.ExpectedPods,
			Selector:           p.Spec.Selector,
		})
	}

	sort.Slice(snap.PDBs, func(i, j int) bool {
		if snap.PDBs[i].Namespace != snap.PDBs[j].Namespace {
			return snap.PDBs[i].Namespace < snap.PDBs[j].Namespace
		}

		return snap.PDBs[i].Name < snap.PDBs[j].Name
	})

	if d.Talos != nil {
		if err := d.readTalos(ctx, snap); err != nil {
			return nil, err
		}
	}

	return snap, nil
}

// readTalos fills Node.Talos for every Talos node, a bounded number of nodes at a time;
// a held node whose Talos API is unreachable keeps a nil Talos.
func (d *Discoverer) readTalos(ctx context.Context, snap *Snapshot) error {
	images := d.Images
	if images == nil {
		images = render.Images
	}

	limit := d.Concurrency
	if limit <= 0 {
		limit = DefaultConcurrency
	}

	var talosNodes []*Node

	for i := range snap.Nodes {
		n := &snap.Nodes[i]

		// A node that is not Talos has no Talos API; the checks refuse it by name.
		if !n.IsTalos() {
			continue
		}

		if n.InternalIP == "" {
			return fmt.Errorf("node %q: no InternalIP address to reach its Talos API: check the Node's status.addresses", n.Name)
		}

		talosNodes = append(talosNodes, n)
	}

	err := talos.ForEach(ctx, talosNodes, (*Node).Address, limit, func(ctx context.Context, n *Node) error {
		ip := n.InternalIP

		version, err := d.Talos.Version(ctx, ip)
		if err != nil {
			err = talosError(n.Name, ip, "version", err)

			// A held node is left as it is: one that is down (the plan's advice for a
			// NotReady node is to hold it) leaves its Talos side unread, not the plan.
			var unreachable *UnreachableError
			if n.Held && errors.As(err, &unreachable) {
				return nil
			}

			return err
		}

		cfg, err := d.Talos.MachineConfig(ctx, ip)
		if err != nil {
			return talosError(n.Name, ip, "machine config", err)
		}

		t := talosFromConfig(version, cfg, images)

		if d.Installed != nil {
			installed, err := d.Installed.Installed(ctx, ip)
			if err != nil {
				return talosError(n.Name, ip, "system extensions", err)
			}

			t.Installed = &installed
		}

		if d.Persistent != nil {
			persistent, err := d.Persistent.PersistentMachineConfig(ctx, ip)
			if err != nil {
				return talosError(n.Name, ip, "persistent machine config", err)
			}

			if t.Staged, err = render.Staged(cfg, persistent); err != nil {
				return fmt.Errorf("node %q: compare its active and persistent machine configs: %w", n.Name, err)
			}

			t.StagedRead = true
		}

		// Each call writes only its own node.
		n.Talos = t

		return nil
	})

	return firstError(err)
}

// firstError keeps one line out of the joined per-node errors: the first, and how many more.
func firstError(err error) error {
	joined, isJoined := err.(interface{ Unwrap() []error })
	if !isJoined {
		return err
	}

	errs := joined.Unwrap()
	if len(errs) <= 1 {
		return errors.Join(errs...)
	}

	return fmt.Errorf("%w (and %d more failed)", errs[0], len(errs)-1)
}

// talosError names the node and says what to check.
func talosError(node, ip, what string, err error) error {
	switch status.Code(err) { //nolint:exhaustive
	case codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("node %q: talos denied reading its %s: %v: use a talosconfig with role os:reader or higher (--talosconfig, --talos-context)", node, what, text.OneLine(err.Error()))
	case codes.Unavailable, codes.DeadlineExceeded:
		return fmt.Errorf("node %q: %w", node, &UnreachableError{
			API:    "talos",
			Target: ip,
			Hint:   "check --talos-endpoints and --talosconfig, and that the node is up",
			Err:    err,
		})
	}

	if errors.Is(err, context.DeadlineExceeded) || isUnreachable(err) {
		return fmt.Errorf("node %q: %w", node, &UnreachableError{
			API:    "talos",
			Target: ip,
			Hint:   "check --talos-endpoints and --talosconfig, and that the node is up",
			Err:    err,
		})
	}

	return fmt.Errorf("node %q: talos %s: %w", node, what, err)
}

// NodeFrom is what a Node says of itself: name, role, hold, kubelet version,
// osImage, InternalIP, readiness (its Talos side is not read).
func NodeFrom(node *corev1.Node) Node {
	n := Node{
		Name:           node.Name,
		KubeletVersion: node.Status.NodeInfo.KubeletVersion,
		OSImage:        node.Status.NodeInfo.OSImage,
		Unschedulable:  node.Spec.Unschedulable,
	}

	_, n.ControlPlane = node.Labels[ControlPlaneLabel]
	n.HoldReason, n.Held = node.Annotations[HoldAnnotation]
	n.Order = node.Labels[OrderLabel]
	n.Labels = node.Labels
	n.Taints = node.Spec.Taints

	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP && n.InternalIP == "" {
			n.InternalIP = a.Address
		}
	}

	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			n.Ready = c.Status == corev1.ConditionTrue
		}
	}

	n.NotReadySince = NotReadySince(node)

	return n
}

// NotReadySince is when the Node's kubelet reported it NotReady (its Ready
// condition False, not Unknown: the kubelet is up and posts its status, as on
// a node back from a boot whose runtime and network are not up yet); zero when
// it does not.
func NotReadySince(node *corev1.Node) time.Time {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionFalse {
			return c.LastTransitionTime.Time
		}
	}

	return time.Time{}
}

func staticPodsByNode(pods []corev1.Pod) map[string]map[Component]StaticPod {
	out := map[string]map[Component]StaticPod{}

	for _, p := range pods {
		if p.Spec.NodeName == "" || len(p.Spec.Containers) == 0 {
			continue
		}

		c := Component(p.Labels[ComponentLabel])

		sp := StaticPod{
			Name:          p.Name,
			Image:         p.Spec.Containers[0].Image,
			ConfigVersion: p.Annotations[ConfigVersionAnnotation],
		}

		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				sp.Ready = cond.Status == corev1.ConditionTrue
			}
		}

		if out[p.Spec.NodeName] == nil {
			out[p.Spec.NodeName] = map[Component]StaticPod{}
		}

		out[p.Spec.NodeName][c] = sp
	}

	return out
}

func kubeProxyFrom(ds *appsv1.DaemonSet) KubeProxyInfo {
	kp := KubeProxyInfo{
		Present: true,
		Desired: ds.Status.DesiredNumberScheduled,
		Ready:   ds.Status.NumberReady,

		MaxUnavailable: DaemonSetMaxUnavailable(ds),
	}

	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == KubeProxyDaemonSet || kp.Image == "" {
			kp.Image = c.Image
		}
	}

	return kp
}

// DaemonSetMaxUnavailable is how many of ds's pods its rolling update
// replaces at once: spec.updateStrategy.rollingUpdate.maxUnavailable, a
// percentage of its pods rounded up as the DaemonSet controller does, 1 by
// default and at least 1 (an OnDelete DaemonSet counts as 1).
func DaemonSetMaxUnavailable(ds *appsv1.DaemonSet) int {
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ru == nil || ru.MaxUnavailable == nil {
		return 1
	}

	n, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, int(ds.Status.DesiredNumberScheduled), true)
	if err != nil || n < 1 {
		return 1
	}

	return n
}
