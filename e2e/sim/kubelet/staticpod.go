package kubelet

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConfigVersionAnnotation is the annotation Talos puts on its static pods.
const ConfigVersionAnnotation = "talos.dev/config-version"

// staticPod runs one control-plane static pod of a node and keeps its mirror
// pod in step: a new spec makes the running pod not Ready, and after the
// restart latency the mirror pod is replaced by one on the new image. A
// kubelet that starts on a new version hashes the static pod anew: it deletes
// the mirror pod, restarts the pod and creates the mirror pod again, a moment
// in which the node's control-plane components have no mirror pod at all.
type staticPod struct {
	n          *node
	component  string
	wantCh     chan StaticPod
	remirrorCh chan struct{}
	last       StaticPod
	// initial is the spec the cluster started with: the neverReady fault
	// applies only to a start on another spec, so a cluster with the fault
	// set still comes up.
	initial StaticPod
	cancel  context.CancelFunc
	done    chan struct{}
}

func newStaticPod(n *node, component string, initial StaticPod) *staticPod {
	ctx, cancel := context.WithCancel(context.Background())
	sp := &staticPod{
		n: n, component: component, initial: initial,
		wantCh: make(chan StaticPod, 1), remirrorCh: make(chan struct{}, 1),
		cancel: cancel, done: make(chan struct{}),
	}
	go sp.run(ctx)
	return sp
}

func (sp *staticPod) want(w StaticPod) {
	if w == sp.last {
		return
	}
	sp.last = w
	select {
	case <-sp.wantCh:
	default:
	}
	sp.wantCh <- w
}

// remirror is the kubelet's restart on a new version: the running pod
// restarts under a new mirror pod.
func (sp *staticPod) remirror() {
	select {
	case sp.remirrorCh <- struct{}{}:
	default:
	}
}

func (sp *staticPod) stop() {
	sp.cancel()
	<-sp.done
	sp.n.setPodStatus(sp.name(), nil)
}

func (sp *staticPod) name() string { return sp.component + "-" + sp.n.name }

func (sp *staticPod) run(ctx context.Context) {
	defer close(sp.done)
	logf := sp.n.log()
	var running *StaticPod
	// ready: the mirror pod was posted Ready and nothing changed since; the
	// kubelet then keeps it so (resyncReady).
	ready := false
	resync := time.NewTicker(staticPodResync)
	defer resync.Stop()
	for {
		var w StaticPod
		remirror := false
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			if ready {
				sp.resyncReady(ctx)
			}
			continue
		case w = <-sp.wantCh:
		case <-sp.remirrorCh:
			if running == nil {
				continue
			}
			w, remirror = *running, true
		}
		ready = false
		switch {
		case remirror:
			logf("kubelet on a new version: mirror pod deleted, static pod restarting", "pod", sp.name())
			if err := sp.deleteMirror(ctx); err != nil {
				logf("delete mirror pod", "pod", sp.name(), "err", err)
			}
		case running != nil:
			// The old container stops: its mirror pod goes not Ready while
			// Talos restarts the static pod.
			if err := sp.setStatus(ctx, false, false); err != nil {
				logf("mirror pod status", "pod", sp.name(), "err", err)
			}
		}
		delay := sp.n.k.opts.PodStart
		if running != nil {
			delay = sp.n.k.opts.StaticPodRestart
		}
		if !sleep(ctx, delay) {
			return
		}
		select {
		case newer := <-sp.wantCh:
			w = newer
		default:
		}
		for {
			err := sp.replace(ctx, w)
			if err == nil {
				break
			}
			logf("mirror pod: will retry", "pod", sp.name(), "err", err)
			if !sleep(ctx, time.Second) {
				return
			}
		}
		running = &w
		sp.n.k.opts.Events.Start(sp.n.name, sp.component, VersionOf(w.Image))
		if w != sp.initial && sp.n.k.opts.Faults.For(sp.n.name).NeverReadyComponent(sp.component) {
			logf("static pod never gets Ready (simulated fault)", "pod", sp.name())
			continue
		}
		if !sleep(ctx, sp.n.k.opts.Ready) {
			return
		}
		// A kubelet keeps syncing the status until the apiserver has it (a
		// write lost to a busy apiserver left the pod not Ready for good), and
		// creates the mirror pod again when someone deleted it.
		for {
			err := sp.setStatus(ctx, true, true)
			if err == nil {
				break
			}
			logf("mirror pod status: will retry", "pod", sp.name(), "err", err)
			if apierrors.IsNotFound(err) {
				if err := sp.replace(ctx, w); err != nil {
					logf("mirror pod: will retry", "pod", sp.name(), "err", err)
				}
			}
			if !sleep(ctx, time.Second) {
				return
			}
		}
		ready = true
	}
}

// staticPodResync is how often a kubelet compares a Ready static pod's mirror
// pod with what it would post.
const staticPodResync = 5 * time.Second

// resyncReady posts the mirror pod Ready again when the API says otherwise: the
// node lifecycle controller marks every pod of a Node it finds Unknown not
// Ready (an apiserver restart can make it so), and a kubelet's status manager
// writes its own status back. Without it the mirror pod stayed not Ready for
// good and the upgrade's verification waited on it (soak seeds 2013, 2028).
func (sp *staticPod) resyncReady(ctx context.Context) {
	pod, err := sp.n.k.opts.Client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, sp.name(), metav1.GetOptions{})
	if err != nil || podIsReady(pod) {
		return
	}
	sp.n.log()("mirror pod not Ready in the API while it runs Ready: posting it again", "pod", sp.name())
	if err := sp.setStatus(ctx, true, true); err != nil {
		sp.n.log()("mirror pod status", "pod", sp.name(), "err", err)
	}
}

// podIsReady reports whether a pod's Ready condition is True.
func podIsReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deleteMirror deletes the mirror pod at once (a mirror pod has no grace).
func (sp *staticPod) deleteMirror(ctx context.Context) error {
	zero := int64(0)
	err := sp.n.k.opts.Client.CoreV1().Pods(metav1.NamespaceSystem).Delete(ctx, sp.name(), metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// replace deletes the mirror pod and creates it anew for w, Running and not
// yet Ready, as a kubelet does when a static pod's spec hash changes.
func (sp *staticPod) replace(ctx context.Context, w StaticPod) error {
	pods := sp.n.k.opts.Client.CoreV1().Pods(metav1.NamespaceSystem)
	if err := sp.deleteMirror(ctx); err != nil {
		return err
	}
	node, err := sp.n.k.opts.Client.CoreV1().Nodes().Get(ctx, sp.n.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	hash := fmt.Sprintf("%x", sha256.Sum256([]byte(sp.component+w.Image+w.ConfigVersion)))[:32]
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sp.name(),
			Namespace: metav1.NamespaceSystem,
			Labels:    map[string]string{"k8s-app": sp.component, "tier": "control-plane"},
			Annotations: map[string]string{
				corev1.MirrorPodAnnotationKey: hash,
				"kubernetes.io/config.hash":   hash,
				"kubernetes.io/config.source": "file",
				ConfigVersionAnnotation:       w.ConfigVersion,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID, Controller: ptr(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:          sp.n.name,
			HostNetwork:       true,
			PriorityClassName: "system-cluster-critical",
			Containers: []corev1.Container{{
				Name:    sp.component,
				Image:   w.Image,
				Command: []string{"/usr/local/bin/" + sp.component},
			}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	}
	// The delete above may still be finishing (a mirror pod has no
	// finalizers, but the informer-driven kubelet could race): retry briefly.
	var last error
	for range 50 {
		if _, last = pods.Create(ctx, pod, metav1.CreateOptions{}); last == nil {
			break
		}
		if !apierrors.IsAlreadyExists(last) {
			return last
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	if last != nil {
		return last
	}
	return sp.setStatus(ctx, true, false)
}

// setStatus writes the mirror pod's status: its container running or not,
// Ready or not.
func (sp *staticPod) setStatus(ctx context.Context, started, ready bool) error {
	pods := sp.n.k.opts.Client.CoreV1().Pods(metav1.NamespaceSystem)
	pod, err := pods.Get(ctx, sp.name(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	pod.Status = runningStatus(pod, sp.n.m.IP().String(), sp.n.m.IP().String(), started, ready)
	sp.n.setPodStatus(sp.name(), &pod.Status)
	_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// runningStatus is the status of a pod whose containers run (started) and
// pass readiness (ready).
func runningStatus(pod *corev1.Pod, hostIP, podIP string, started, ready bool) corev1.PodStatus {
	now := metav1.Now()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		c := corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now}
		for _, old := range pod.Status.Conditions {
			if old.Type == t && old.Status == s {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    hostIP,
		HostIPs:   []corev1.HostIP{{IP: hostIP}},
		PodIP:     podIP,
		PodIPs:    []corev1.PodIP{{IP: podIP}},
		StartTime: pod.Status.StartTime,
		QOSClass:  pod.Status.QOSClass,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodReadyToStartContainers, true),
			cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready),
			cond(corev1.PodReady, ready),
			cond(corev1.PodScheduled, true),
		},
	}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	for _, c := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: ready, Started: ptr(started), ContainerID: "containerd://" + string(pod.UID)[:8] + c.Name}
		if started {
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: now}
			for _, old := range pod.Status.ContainerStatuses {
				if old.Name == c.Name && old.State.Running != nil {
					cs.State.Running.StartedAt = old.State.Running.StartedAt
				}
			}
		} else {
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	return st
}
