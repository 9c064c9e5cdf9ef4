package kubelet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

const (
	leaseNamespace   = "kube-node-lease"
	leaseDuration    = 40
	leaseRenewPeriod = 10 * time.Second
	controlPlaneRole = "node-role.kubernetes.io/control-plane"
)

// node is the kubelet of one machine. One goroutine (run) owns its state.
type node struct {
	k    *Kubelets
	m    Machine
	name string

	// Owned by run (registered by Start before run starts).
	registered     bool
	up             bool
	bootID         string
	kubeletVersion string
	kubeletImage   string
	kubeletOn      bool // the kubelet runs: the machine's kubelet service is up
	ready          bool
	// booted: the machine (re)booted and its kubelet has not started in this
	// boot yet. readyAt is when a kubelet that started in a fresh boot posts
	// Ready (zero when none is due): a booted node comes Ready Options.Ready
	// after its kubelet starts, as a real one once its runtime and network
	// are up; a kubelet restarted within a boot is Ready at once.
	booted     bool
	readyAt    time.Time
	staticPods map[string]*staticPod
	// initialStaticPods are the specs first seen, kept across reboots.
	initialStaticPods map[string]StaticPod
	lastLease         time.Time
	// lease is the Lease last written, renewed in place as the kubelet's
	// lease controller does (one request a renewal, none to read it); nil
	// after a failed write, when the next renewal reads it again.
	lease *coordinationv1.Lease

	// running is whether the machine is up, read by pod runners.
	running atomic.Bool

	// What the node shows its machine (see Machine.Observe), written by run
	// (Ready) and by the static pods (their statuses).
	obsMu    sync.Mutex
	obsReady bool
	obsPods  map[string]corev1.PodStatus
	// reportMu makes each report's snapshot and its delivery one step: two
	// static pods reporting at once could otherwise deliver the older
	// snapshot last, and the machine kept a pod not Ready that was (seen in
	// CI: MachineStatus not ready for a minute).
	reportMu sync.Mutex

	ipMu   sync.Mutex
	podIPs map[string]string
	nextIP int
}

func newNode(k *Kubelets, m Machine) *node {
	return &node{
		k: k, m: m, name: m.Name(), staticPods: map[string]*staticPod{}, initialStaticPods: map[string]StaticPod{},
		podIPs: map[string]string{}, obsPods: map[string]corev1.PodStatus{},
	}
}

func (n *node) log() func(msg string, args ...any) {
	return func(msg string, args ...any) { n.k.opts.Log.Info(msg, append([]any{"node", n.name}, args...)...) }
}

// register creates (or takes over) the Node object, NotReady until the
// kubelet's first sync.
func (n *node) register(ctx context.Context) error {
	st := n.m.Current()
	labels := map[string]string{
		"kubernetes.io/hostname": n.name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	var taints []corev1.Taint
	if n.m.ControlPlane() {
		labels[controlPlaneRole] = ""
		taints = append(taints, corev1.Taint{Key: controlPlaneRole, Effect: corev1.TaintEffectNoSchedule})
	}
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
	}
	if _, err := n.k.opts.Client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	n.kubeletImage = st.KubeletImage
	n.kubeletVersion = VersionOf(st.KubeletImage)
	if err := n.writeStatus(ctx, st, false, "KubeletNotReady", "kubelet is starting"); err != nil {
		return err
	}
	n.registered = true
	return nil
}

// writeStatus writes the Node's status: addresses, node info and the Ready
// condition.
func (n *node) writeStatus(ctx context.Context, st MachineState, ready bool, reason, message string) error {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		obj, err := n.k.opts.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		obj.Status.Capacity = nodeCapacity()
		obj.Status.Allocatable = nodeCapacity()
		obj.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.m.IP().String()},
			{Type: corev1.NodeHostName, Address: n.name},
		}
		obj.Status.NodeInfo = corev1.NodeSystemInfo{
			MachineID:               "sim-" + n.name,
			SystemUUID:              "sim-" + n.name,
			BootID:                  st.BootID,
			KernelVersion:           "6.18.0-talos",
			OSImage:                 fmt.Sprintf("Talos (%s)", st.TalosVersion),
			ContainerRuntimeVersion: "containerd://2.1.5",
			KubeletVersion:          n.kubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            "amd64",
		}
		obj.Status.DaemonEndpoints.KubeletEndpoint.Port = kubeletPort
		var conds []corev1.NodeCondition
		for _, c := range obj.Status.Conditions {
			if c.Type != corev1.NodeReady {
				conds = append(conds, c)
			}
		}
		for _, t := range []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure} {
			if !hasCondition(conds, t) {
				conds = append(conds, corev1.NodeCondition{Type: t, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficient" + string(t)[:len(t)-len("Pressure")], LastHeartbeatTime: now, LastTransitionTime: now})
			}
		}
		ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, Message: message, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, c := range obj.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == status {
				ready.LastTransitionTime = c.LastTransitionTime
			}
		}
		obj.Status.Conditions = append(conds, ready)
		_, err = n.k.opts.Client.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		return err
	})
	if err == nil {
		n.obsMu.Lock()
		n.obsReady = ready
		n.obsMu.Unlock()
		n.report()
	}
	return err
}

// report shows the machine the Node's Ready condition and the static pods'
// statuses, as Talos reads them.
func (n *node) report() {
	n.reportMu.Lock()
	defer n.reportMu.Unlock()
	n.obsMu.Lock()
	o := Observed{NodeReady: n.obsReady, StaticPods: make(map[string]corev1.PodStatus, len(n.obsPods))}
	for k, v := range n.obsPods {
		o.StaticPods[k] = *v.DeepCopy()
	}
	n.obsMu.Unlock()
	n.m.Observe(o)
}

// setPodStatus records a static pod's status as the kubelet's pod list
// shows it (nil: the pod is gone) and reports it.
func (n *node) setPodStatus(name string, st *corev1.PodStatus) {
	n.obsMu.Lock()
	if st == nil {
		delete(n.obsPods, metav1.NamespaceSystem+"/"+name)
	} else {
		n.obsPods[metav1.NamespaceSystem+"/"+name] = *st.DeepCopy()
	}
	n.obsMu.Unlock()
	n.report()
}

func hasCondition(conds []corev1.NodeCondition, t corev1.NodeConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return true
		}
	}
	return false
}

// run is the kubelet's loop: it reacts to the machine's changes and renews
// the Lease.
func (n *node) run(ctx context.Context) {
	changes, cancel := n.m.Changes()
	defer cancel()
	lease := time.NewTicker(leaseRenewPeriod)
	defer lease.Stop()
	for {
		n.sync(ctx)
		var (
			due   <-chan time.Time
			timer *time.Timer
		)
		if !n.readyAt.IsZero() {
			timer = time.NewTimer(time.Until(n.readyAt))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			for _, sp := range n.staticPods {
				sp.stop()
			}
			return
		case <-changes:
		case <-lease.C:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// sync brings the node's Kubernetes view in step with its machine.
func (n *node) sync(ctx context.Context) {
	st := n.m.Current()
	logf := n.log()
	if !st.Up {
		if n.up {
			logf("machine down: pods stopped")
			n.up = false
			n.setUp(false)
			for _, sp := range n.staticPods {
				sp.stop()
			}
			n.staticPods = map[string]*staticPod{}
			for _, r := range n.k.runnersOn(n.name) {
				r.nodeDown()
			}
			n.ready, n.readyAt = false, time.Time{}
			if st.PowerLost {
				logf("machine lost power: nothing posted, the Node goes Unknown when its lease and status stop")
				return
			}
			if err := n.writeStatus(ctx, st, false, "KubeletNotReady", "node is shutting down"); err != nil {
				logf("write status", "err", err)
			}
		}
		return
	}
	if !n.registered {
		// The machine's first boot (it was powered off): the kubelet
		// registers its Node, NotReady until it starts below.
		if err := n.register(ctx); err != nil {
			logf("register", "err", err)
			return
		}
		logf("machine booted: node registered")
	}
	if !n.up || n.bootID != st.BootID {
		// A (re)boot: pods may run again; the kubelet starts with its service.
		n.up, n.bootID, n.kubeletOn, n.booted = true, st.BootID, false, true
		n.setUp(true)
	}
	if !st.KubeletRunning {
		// Talos stopped the kubelet (to restart it on a new spec): the node
		// goes NotReady and nothing of the kubelet's work happens (no lease,
		// no static pod change) until its service runs again. Containers
		// keep running.
		if n.kubeletOn {
			logf("kubelet stopped: node NotReady")
			n.kubeletOn, n.ready = false, false
			if err := n.writeStatus(ctx, st, false, "KubeletNotReady", "kubelet is restarting"); err != nil {
				logf("write status", "err", err)
			}
		}
		return
	}
	if !n.kubeletOn || st.KubeletImage != n.kubeletImage {
		// The kubelet service (re)started: the kubelet runs the machine's
		// kubelet image. On a new version it hashes the static pods anew, so
		// once Ready it recreates their mirror pods (the pods restart).
		newVersion := n.kubeletVersion != "" && VersionOf(st.KubeletImage) != n.kubeletVersion
		n.kubeletOn = true
		n.kubeletImage = st.KubeletImage
		n.kubeletVersion = VersionOf(st.KubeletImage)
		n.k.opts.Events.Start(n.name, events.Kubelet, n.kubeletVersion)
		if n.booted && n.k.opts.Ready > 0 {
			// The first start in a boot: Ready once the node is (runtime, network).
			n.booted, n.readyAt = false, time.Now().Add(n.k.opts.Ready)
			if err := n.writeStatus(ctx, st, false, "KubeletNotReady", "container runtime network not ready: the node is starting"); err != nil {
				logf("write status", "err", err)
			}
		} else {
			n.booted = false
			n.becomeReady(ctx, st)
		}
		if newVersion {
			for _, sp := range n.staticPods {
				sp.remirror()
			}
			if n.k.opts.Faults.For(n.name).RestartsContainers {
				for _, r := range n.k.runnersOn(n.name) {
					r.definitionChanged()
				}
			}
		}
	} else if !n.ready && !n.readyAt.IsZero() {
		// Starting in a fresh boot: Ready at readyAt (run wakes then).
		if !time.Now().Before(n.readyAt) {
			n.readyAt = time.Time{}
			n.becomeReady(ctx, st)
		}
	} else if !n.ready && !n.k.opts.Faults.For(n.name).StayNotReady {
		n.becomeReady(ctx, st)
	} else {
		n.repostIfStale(ctx, st)
	}
	n.renewLease(ctx)
	for component, want := range st.StaticPods {
		sp := n.staticPods[component]
		if sp == nil {
			if _, ok := n.initialStaticPods[component]; !ok {
				n.initialStaticPods[component] = want
			}
			sp = newStaticPod(n, component, n.initialStaticPods[component])
			n.staticPods[component] = sp
		}
		sp.want(want)
	}
	for component, sp := range n.staticPods {
		if _, ok := st.StaticPods[component]; !ok {
			sp.stop()
			delete(n.staticPods, component)
		}
	}
}

func (n *node) becomeReady(ctx context.Context, st MachineState) {
	if n.k.opts.Faults.For(n.name).StayNotReady {
		if err := n.writeStatus(ctx, st, false, "KubeletNotReady", "container runtime network not ready (simulated fault)"); err != nil {
			n.log()("write status", "err", err)
		}
		n.ready = false
		return
	}
	if err := n.writeStatus(ctx, st, true, "KubeletReady", "kubelet is posting ready status"); err != nil {
		n.log()("write status", "err", err)
		return
	}
	n.ready = true
}

// repostIfStale posts the Node's Ready status again when the Node in the API
// does not say Ready while the kubelet is: the node lifecycle controller set it
// Unknown while the kubelet could not reach the apiserver (a restart), or
// someone wrote it. A kubelet's node status sync compares what it would post
// with the Node and posts on a difference; without it the Node stays
// NotReady for good once the apiserver is back.
func (n *node) repostIfStale(ctx context.Context, st MachineState) {
	if !n.ready || n.k.nodeLister == nil {
		return
	}
	obj, err := n.k.nodeLister.Get(n.name)
	if err != nil {
		return // not in the watch yet
	}
	for _, c := range obj.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			n.log()("the Node says NotReady while the kubelet is Ready: posting Ready again", "reason", c.Reason)
			n.becomeReady(ctx, st)
			return
		}
	}
}

// setUp tells pod runners whether the node's kubelet runs.
func (n *node) setUp(up bool) {
	n.running.Store(up)
	if up {
		for _, r := range n.k.runnersOn(n.name) {
			r.nodeUp()
		}
	}
}

func (n *node) renewLease(ctx context.Context) {
	if time.Since(n.lastLease) < leaseRenewPeriod/2 {
		return
	}
	leases := n.k.opts.Client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	if n.lease != nil {
		l := n.lease.DeepCopy()
		l.Spec.RenewTime = &now
		if updated, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			n.lease, n.lastLease = updated, time.Now()
			return
		}
		n.lease = nil
	}
	l, err := leases.Get(ctx, n.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node, err := n.k.opts.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return
		}
		created, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: leaseNamespace, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: n.name, UID: types.UID(node.UID),
			}}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: &n.name, LeaseDurationSeconds: ptr(int32(leaseDuration)), RenewTime: &now},
		}, metav1.CreateOptions{})
		if err == nil {
			n.lease, n.lastLease = created, time.Now()
		}
	case err == nil:
		l.Spec.RenewTime = &now
		if updated, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			n.lease, n.lastLease = updated, time.Now()
		}
	}
}

func ptr[T any](v T) *T { return &v }

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
