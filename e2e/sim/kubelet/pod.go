package kubelet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// podRunner runs one pod bound to a simulated node, from its first sight to
// its removal. Its goroutine (run) owns the pod's lifecycle; the informer and
// the node talk to it through channels.
type podRunner struct {
	k    *Kubelets
	n    *node
	uid  string
	ns   string
	name string

	updates chan *corev1.Pod
	nodeCh  chan bool // node up (true) or down (false)
	// changed says the kubelet, on a new version, hashes the pod's
	// containers differently: it restarts them (faults.Node.RestartsContainers).
	changed  chan struct{}
	goneCh   chan struct{}
	goneOnce sync.Once

	mu    sync.Mutex
	procs []*containerProc
	exits chan struct{}
	// restarts counts the containers' restarts (the restartCount posted).
	restarts int32
	// admitted is when the kubelet took the pod, its status.startTime: a kubelet
	// sets it before it pulls the images and starts the containers.
	admitted metav1.Time
}

func newPodRunner(k *Kubelets, n *node, pod *corev1.Pod) *podRunner {
	return &podRunner{
		k: k, n: n, uid: string(pod.UID), ns: pod.Namespace, name: pod.Name, admitted: metav1.Now(),
		updates: make(chan *corev1.Pod, 1),
		nodeCh:  make(chan bool, 4),
		changed: make(chan struct{}, 1),
		goneCh:  make(chan struct{}),
		exits:   make(chan struct{}, 16),
	}
}

func (r *podRunner) update(pod *corev1.Pod) {
	select {
	case <-r.updates:
	default:
	}
	r.updates <- pod
}

func (r *podRunner) gone()     { r.goneOnce.Do(func() { close(r.goneCh) }) }
func (r *podRunner) nodeDown() { r.nodeCh <- false }
func (r *podRunner) nodeUp()   { r.nodeCh <- true }

// definitionChanged restarts the pod's running containers, as a kubelet
// does for a container whose definition hash changed: it kills it with the
// pod's grace and starts it again in the same pod, whatever the pod's
// restartPolicy.
func (r *podRunner) definitionChanged() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *podRunner) logf(msg string, args ...any) {
	r.k.opts.Log.Info(msg, append([]any{"node", r.n.name, "pod", r.ns + "/" + r.name}, args...)...)
}

func (r *podRunner) run(ctx context.Context) {
	var pod *corev1.Pod
	select {
	case pod = <-r.updates:
	case <-ctx.Done():
		return
	}
	root, asProcess := r.k.imageRoot(pod.Spec.Containers[0].Image)
	started := false
	killedByReboot := false
	startAt := time.Now().Add(r.k.opts.PodStart)
	var readyAt time.Time
	postedReady := false // Ready written, and the pod still runs

	for {
		terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		switch {
		case pod.DeletionTimestamp != nil:
			r.terminate(ctx, pod, started)
			return
		case terminal:
			// Nothing runs; wait for the pod to be deleted.
		case !r.n.running.Load():
			// The machine is down: nothing starts until it is back.
		case killedByReboot:
			r.writeTerminated(ctx, 137, "the node rebooted while the pod ran")
			killedByReboot = false
		case !started && !time.Now().Before(startAt):
			if asProcess {
				if err := r.startProcesses(ctx, pod, root); err != nil {
					if apierrors.IsNotFound(err) {
						// As a kubelet does for a Secret or ConfigMap that is
						// not there yet: the pod waits (ContainerCreating).
						r.logf("a volume's source is missing: will retry", "err", err)
						startAt = time.Now().Add(2 * time.Second)
						break
					}
					r.logf("start processes", "err", err)
					r.writeTerminated(ctx, 128, err.Error())
					break
				}
			}
			started = true
			readyAt = time.Now().Add(r.k.opts.Ready)
			r.writeRunning(ctx, false)
			if pod.Labels["k8s-app"] == "kube-proxy" {
				r.k.opts.Events.Start(r.n.name, events.KubeProxy, VersionOf(pod.Spec.Containers[0].Image))
			}
		case started && !readyAt.IsZero() && !time.Now().Before(readyAt):
			readyAt = time.Time{}
			r.writeRunning(ctx, true)
			postedReady = true
		case postedReady && pod.Status.Phase == corev1.PodRunning && !podIsReady(pod):
			// The node lifecycle controller marked the pod not Ready (its Node
			// went Unknown): the kubelet's status manager writes its own back.
			r.logf("pod not Ready in the API while it runs Ready: posting it again")
			r.writeRunning(ctx, true)
		}

		var timer <-chan time.Time
		if !terminal && r.n.running.Load() {
			switch {
			case !started:
				timer = time.After(time.Until(startAt))
			case !readyAt.IsZero():
				timer = time.After(time.Until(readyAt))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-r.goneCh:
			r.stopProcesses(0)
			return
		case p := <-r.updates:
			pod = p
		case up := <-r.nodeCh:
			postedReady = false
			if !up {
				if started && asProcess {
					r.stopProcesses(0)
					killedByReboot = true
				}
				started = false
			}
			startAt = time.Now().Add(r.k.opts.PodStart)
		case <-r.changed:
			if !started || terminal || pod.DeletionTimestamp != nil {
				break
			}
			grace := 30 * time.Second
			if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
			}
			r.logf("kubelet on a new version: container definition changed, killing and restarting the pod's containers")
			if asProcess {
				r.stopProcesses(grace)
			}
			started, postedReady, readyAt = false, false, time.Time{}
			r.restarts++
			r.writeRunning(ctx, false)
			startAt = time.Now().Add(r.k.opts.PodStart)
		case <-r.exits:
			if code, done := r.exited(); done && started {
				r.writeExited(ctx, pod, code)
			}
		case <-timer:
		}
	}
}

// terminate ends a pod that is being deleted: its containers get the grace
// period, its final status is written, and the pod object is removed.
func (r *podRunner) terminate(ctx context.Context, pod *corev1.Pod, started bool) {
	grace := 30 * time.Second
	if pod.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	}
	code := 0
	if started {
		r.mu.Lock()
		process := len(r.procs) > 0
		r.mu.Unlock()
		code = r.stopProcesses(grace)
		if !process {
			r.finishWork(ctx, grace)
		}
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyAlways && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		if code == 0 && len(r.procs) == 0 {
			code = 143
		}
		r.writeTerminated(ctx, code, "terminated: the pod was deleted")
	}
	zero := int64(0)
	uid := pod.UID
	err := r.untilLanded(ctx, "delete pod", func() error {
		return r.k.opts.Client.CoreV1().Pods(r.ns).Delete(ctx, r.name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid},
		})
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.logf("delete pod", "err", err)
	}
}

// finishWork is a simulated pod's own stop on SIGTERM (one not run as a
// process, which takes its own time in stopProcesses): it takes the node's
// faults.Node.TerminationTakes, at most grace.
func (r *podRunner) finishWork(ctx context.Context, grace time.Duration) {
	takes := min(r.k.opts.Faults.For(r.n.name).TerminationTakes.Duration, grace)
	if takes <= 0 {
		return
	}
	r.logf("terminating: the pod finishes its work", "takes", takes)
	done := time.After(takes)
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.goneCh:
			return
		case up := <-r.nodeCh:
			if up {
				continue
			}
			// The machine went down under the pod: its work is lost.
			r.logf("terminating: the node went down before the pod finished its work")
			r.k.opts.Events.Start(r.n.name, events.PodCut, r.ns+"/"+r.name)
			return
		case <-done:
			r.k.opts.Events.Start(r.n.name, events.PodStopped, r.ns+"/"+r.name)
			return
		}
	}
}

func (r *podRunner) podIP(pod *corev1.Pod) string {
	if pod.Spec.HostNetwork {
		return r.n.m.IP().String()
	}
	return r.n.podIP(r.uid)
}

// mutateStatus writes the pod's status as mutate changes it. Like a kubelet's
// status manager, it keeps trying until the write lands: an apiserver away
// for a while (restarting, unreachable) delays a pod's status, it does not
// lose it. It gives up when the pod is gone, ctx ends, or the apiserver
// refuses the write itself.
func (r *podRunner) mutateStatus(ctx context.Context, mutate func(pod *corev1.Pod)) {
	pods := r.k.opts.Client.CoreV1().Pods(r.ns)
	err := r.untilLanded(ctx, "write pod status", func() error {
		return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
			pod, err := pods.Get(ctx, r.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if string(pod.UID) != r.uid {
				return nil
			}
			mutate(pod)
			_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
			return err
		})
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		r.logf("write pod status", "err", err)
	}
}

// untilLanded calls write until it succeeds or fails for a reason that
// another try cannot change (the object gone, the request refused), waiting
// longer between tries, up to 5s, while the apiserver cannot be reached or
// answers that it cannot serve; it stops when ctx ends or the pod is gone.
func (r *podRunner) untilLanded(ctx context.Context, what string, write func() error) error {
	wait := 500 * time.Millisecond
	for tries := 1; ; tries++ {
		err := write()
		if err == nil || !transient(err) {
			return err
		}
		if tries == 1 {
			r.logf(what+": will retry until the apiserver takes it", "err", err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-r.goneCh:
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// transient tells whether a write's error may go away by itself: no answer
// from the apiserver, or an answer that it cannot serve now.
func transient(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // no answer: connection refused, reset, timed out
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

func (r *podRunner) writeRunning(ctx context.Context, ready bool) {
	r.mutateStatus(ctx, func(pod *corev1.Pod) {
		keep := preservedConditions(pod)
		if pod.Status.StartTime == nil {
			pod.Status.StartTime = r.admitted.DeepCopy()
		}
		pod.Status = runningStatus(pod, r.n.m.IP().String(), r.podIP(pod), true, ready)
		pod.Status.Conditions = append(pod.Status.Conditions, keep...)
		for i := range pod.Status.ContainerStatuses {
			pod.Status.ContainerStatuses[i].RestartCount = r.restarts
		}
	})
}

// writeExited records that every container ended, as a kubelet does for a
// pod that does not restart them.
func (r *podRunner) writeExited(ctx context.Context, pod *corev1.Pod, code int) {
	if pod.Spec.RestartPolicy == corev1.RestartPolicyAlways {
		r.logf("container of a restartPolicy Always pod exited; not restarted by the simulator", "code", code)
	}
	r.writeTerminated(ctx, code, "")
}

func (r *podRunner) writeTerminated(ctx context.Context, code int, message string) {
	r.mutateStatus(ctx, func(pod *corev1.Pod) {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return
		}
		keep := preservedConditions(pod)
		st := runningStatus(pod, r.n.m.IP().String(), r.podIP(pod), false, false)
		st.Phase = corev1.PodFailed
		if code == 0 {
			st.Phase = corev1.PodSucceeded
		}
		st.Message = message
		now := metav1.Now()
		for i := range st.ContainerStatuses {
			cs := &st.ContainerStatuses[i]
			reason := "Completed"
			if code != 0 {
				reason = "Error"
			}
			cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: int32(code), Reason: reason, Message: message, FinishedAt: now,
			}}
			cs.Started = ptr(false)
			cs.RestartCount = r.restarts
		}
		st.Conditions = append(st.Conditions, keep...)
		pod.Status = st
	})
}

// preservedConditions are conditions set by others (DisruptionTarget, set by
// the eviction API) that a kubelet keeps.
func preservedConditions(pod *corev1.Pod) []corev1.PodCondition {
	var out []corev1.PodCondition
	for _, c := range pod.Status.Conditions {
		switch c.Type {
		case corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized, corev1.PodScheduled, corev1.PodReadyToStartContainers:
		default:
			out = append(out, c)
		}
	}
	return out
}

func (n *node) podIP(uid string) string {
	n.ipMu.Lock()
	defer n.ipMu.Unlock()
	if ip, ok := n.podIPs[uid]; ok {
		return ip
	}
	n.nextIP++
	a := n.m.IP().As4()
	ip := fmt.Sprintf("10.%d.%d.%d", 128+int(a[2])%128, a[3], n.nextIP%250+2)
	n.podIPs[uid] = ip
	return ip
}
