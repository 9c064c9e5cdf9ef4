package kubelet

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
)

// A pod's exit is written even when the apiserver was away at that moment (a
// restart): a kubelet's status manager keeps its pods' statuses until they
// land. Without it the pod of a process that ended stays Running in the API
// for good, and its Job never replaces it.
func TestPodStatusLandsAfterTheAPIServerIsBack(t *testing.T) {
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "ichor-system", UID: "4f1c2a9e-0b7d-4c55-9e0a-2d3c4b5a6f70"},
		Spec:       corev1.PodSpec{NodeName: "worker-1", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "runner"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	client := fake.NewClientset(pod)
	var refusals atomic.Int32
	refusals.Store(3)
	client.PrependReactor("*", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refusals.Add(-1) >= 0 {
			return true, nil, &netError{syscall.ECONNREFUSED}
		}
		return false, nil, nil
	})
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	r := newPodRunner(k, n, pod)

	r.writeTerminated(ctx, 1, "error: lost the lock")

	got, err := client.CoreV1().Pods("ichor-system").Get(ctx, "runner", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, corev1.PodFailed, got.Status.Phase, "written once the apiserver answered")

	// A refusal that another try cannot change is not retried.
	client.PrependReactor("update", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "runner", errors.New("no"))
	})
	require.False(t, transient(apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "runner", errors.New("no"))))
	require.True(t, transient(&netError{syscall.ECONNREFUSED}))
	require.True(t, transient(apierrors.NewServiceUnavailable("starting")))
	r.writeTerminated(ctx, 1, "again") // returns: it does not wait for a write that cannot land
}

type netError struct{ errno syscall.Errno }

func (e *netError) Error() string { return "dial tcp 127.0.0.1:6443: " + e.errno.Error() }
func (e *netError) Unwrap() error { return e.errno }

// A Node the node lifecycle controller marked Unknown while its kubelet could not
// reach the apiserver (a restart) is posted Ready again by the kubelet that is
// Ready, as a kubelet's node status sync does on a difference: without it the
// Node stayed NotReady for good and the upgrade's verification waited on it
// (soak seed 2028).
func TestNodeStatusPostedAgainWhenMarkedUnknown(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{},
		nodeLister: corelisters.NewNodeLister(indexer)}
	m := fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")}
	n := newNode(k, m)
	require.NoError(t, n.register(ctx))
	n.sync(ctx) // the kubelet runs, its Node Ready
	require.True(t, n.ready)

	ready := func() corev1.ConditionStatus {
		got, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status
			}
		}
		return ""
	}
	markUnknown := func() {
		got, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		for i, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady {
				got.Status.Conditions[i].Status, got.Status.Conditions[i].Reason = corev1.ConditionUnknown, "NodeStatusUnknown"
			}
		}
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.NoError(t, indexer.Add(got)) // what the watch delivers
	}

	markUnknown()
	n.sync(ctx)
	assert.Equal(t, corev1.ConditionTrue, ready(), "posted Ready again")

	// A kubelet that is not Ready leaves the Node as it is.
	markUnknown()
	n.ready = false
	n.repostIfStale(ctx, m.Current())
	assert.Equal(t, corev1.ConditionUnknown, ready())
}

// A mirror pod the node lifecycle controller marked not Ready (its Node went
// Unknown during an apiserver restart) is posted Ready again by its kubelet:
// the upgrade's verification waited on it for good (soak seeds 2013, 2028).
func TestMirrorPodPostedReadyAgain(t *testing.T) {
	ctx := context.Background()
	mirror := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-cp-1", Namespace: metav1.NamespaceSystem},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "NodeNotReady"},
		}},
	}
	client := fake.NewClientset(mirror)
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "cp-1", ip: netip.MustParseAddr("127.0.0.10")})
	sp := &staticPod{n: n, component: "kube-apiserver"}

	sp.resyncReady(ctx)

	got, err := client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, "kube-apiserver-cp-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, podIsReady(got), "posted Ready again: %+v", got.Status.Conditions)
}

// downMachine is fakeMachine gone down: by a shutdown or reboot, or by a power loss.
type downMachine struct {
	fakeMachine
	powerLost bool
}

func (m downMachine) Current() MachineState {
	return MachineState{Up: false, PowerLost: m.powerLost, TalosVersion: "v1.14.1"}
}

// A machine that shuts down has its kubelet post the Node NotReady on the way down; one
// that loses its power posts nothing: the Node stays as it was until the node
// lifecycle controller marks it Unknown (seen in TestJobRunnerNodeLost: a power loss
// showed NotReady at once, and the runner's pod was replaced far sooner than on a real
// cluster).
func TestPowerLossPostsNothing(t *testing.T) {
	for _, lost := range []bool{false, true} {
		ctx := context.Background()
		client := fake.NewClientset()
		k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{},
			nodeLister: corelisters.NewNodeLister(cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}))}
		up := fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")}
		n := newNode(k, up)
		require.NoError(t, n.register(ctx))
		n.sync(ctx)
		require.True(t, n.ready)

		n.m = downMachine{fakeMachine: up, powerLost: lost}
		n.sync(ctx)
		assert.False(t, n.up, "power lost %v: the node is down", lost)

		got, err := client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		var ready corev1.NodeCondition
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = c
			}
		}
		if lost {
			assert.Equal(t, corev1.ConditionTrue, ready.Status, "a powerless kubelet posts nothing")
		} else {
			assert.Equal(t, corev1.ConditionFalse, ready.Status, "a shutdown posts NotReady")
			assert.Equal(t, "node is shutting down", ready.Message)
		}
	}
}

// A kubelet whose container hash changed with its version (v1.31's did) kills
// each running container and starts it again in the same pod, whatever its
// restartPolicy: the pod stays Running, its restart count one more. The
// runner's pod meets it when it stays on its node through that node's kubelet
// upgrade.
func TestDefinitionChangedRestartsTheContainersInThePod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "ichor-system", UID: "5b2d3c4e-1f8a-4d66-8a1b-3e4f5a6b7c81"},
		Spec: corev1.PodSpec{NodeName: "worker-1", RestartPolicy: corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr[int64](1), Containers: []corev1.Container{{Name: "runner", Image: "registry.local/runner:v1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	client := fake.NewClientset(pod)
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler), PodStart: 10 * time.Millisecond, Ready: 10 * time.Millisecond},
		nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	n.running.Store(true)
	r := newPodRunner(k, n, pod)
	r.update(pod)
	go r.run(ctx)

	status := func() *corev1.Pod {
		got, err := client.CoreV1().Pods("ichor-system").Get(ctx, "runner", metav1.GetOptions{})
		require.NoError(t, err)
		return got
	}
	readyWith := func(restarts int32) func() bool {
		return func() bool {
			got := status()
			return got.Status.Phase == corev1.PodRunning && podIsReady(got) &&
				len(got.Status.ContainerStatuses) == 1 && got.Status.ContainerStatuses[0].RestartCount == restarts
		}
	}

	require.Eventually(t, readyWith(0), 5*time.Second, 10*time.Millisecond, "running and Ready first")

	r.update(status())
	r.definitionChanged()

	require.Eventually(t, readyWith(1), 5*time.Second, 10*time.Millisecond, "restarted in the same pod, Running and Ready again")
	assert.Equal(t, pod.UID, status().UID)
}

// A pod's startTime is when the kubelet took it, before its containers start (a
// kubelet sets it before it pulls the images): its start to Ready is the pod start
// and the readiness, as on a real node, not the readiness alone.
func TestPodStartTimeIsItsAdmission(t *testing.T) {
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy-a", Namespace: "kube-system", UID: "8e0c1d2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"},
		Spec:       corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "kube-proxy"}}},
	}
	client := fake.NewClientset(pod)
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	r := newPodRunner(k, n, pod)

	time.Sleep(20 * time.Millisecond) // the pod start
	r.writeRunning(ctx, true)

	got, err := client.CoreV1().Pods("kube-system").Get(ctx, "kube-proxy-a", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, got.Status.StartTime)
	assert.True(t, got.Status.StartTime.Equal(&r.admitted), "startTime %s, admitted %s", got.Status.StartTime, r.admitted)

	for _, c := range got.Status.Conditions {
		if c.Type == corev1.PodReady {
			assert.GreaterOrEqual(t, c.LastTransitionTime.Sub(got.Status.StartTime.Time), 20*time.Millisecond, "Ready after the start")
		}
	}
}

// An optional Secret or ConfigMap that is not there mounts as an empty volume, as a
// kubelet mounts it; one that is not optional keeps the pod from starting (a volume's
// source is missing: the pod waits, ContainerCreating).
func TestOptionalVolumeSourceMayBeMissing(t *testing.T) {
	ctx := context.Background()
	optional := func(o bool) *bool { return &o }
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "ichor-system", UID: "0c4f6a2e-5d1b-4f3a-9e8d-7b6a5c4d3e2f"},
		Spec: corev1.PodSpec{NodeName: "worker-1", Volumes: []corev1.Volume{
			{Name: "talos", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "gone", Optional: optional(true)}}},
			{Name: "extra", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: "gone"}, Optional: optional(true)}}},
		}},
	}
	client := fake.NewClientset(pod)
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	r := newPodRunner(k, n, pod)

	vols, err := r.materializeVolumes(ctx, pod, t.TempDir())
	require.NoError(t, err)
	assert.Len(t, vols, 2, "both mounted, empty")

	pod.Spec.Volumes[0].Secret.Optional = optional(false)
	_, err = r.materializeVolumes(ctx, pod, t.TempDir())
	require.Error(t, err)
	assert.True(t, apierrors.IsNotFound(err), "the pod waits for it: %v", err)
}

// A container restarted in its pod mounts its volumes again: a Secret deleted
// since is no longer there (the Job's Talos credentials, which the operation's
// end deletes, are gone for a runner container its new kubelet restarts), while
// an emptyDir keeps what was written to it.
func TestVolumesMountedAgainHoldTheirSourceNow(t *testing.T) {
	ctx := context.Background()
	optional := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "ichor-system", UID: "5d0c3b2a-1e4f-4a6b-8c7d-9e0f1a2b3c4d"},
		Spec: corev1.PodSpec{NodeName: "worker-1", Volumes: []corev1.Volume{
			{Name: "talos", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "ichor-talos", Optional: &optional}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		}},
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ichor-talos", Namespace: "ichor-system"}, Data: map[string][]byte{"config": []byte("context: x")}}
	client := fake.NewClientset(pod, secret)
	k := &Kubelets{opts: Options{Client: client, Log: slog.New(slog.DiscardHandler)}, nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	r := newPodRunner(k, newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")}), pod)
	dir := t.TempDir()

	vols, err := r.materializeVolumes(ctx, pod, dir)
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(vols["talos"], "config"))
	require.NoError(t, os.WriteFile(filepath.Join(vols["scratch"], "written"), []byte("1"), 0o644))

	require.NoError(t, client.CoreV1().Secrets("ichor-system").Delete(ctx, "ichor-talos", metav1.DeleteOptions{}))

	vols, err = r.materializeVolumes(ctx, pod, dir)
	require.NoError(t, err)
	assert.NoFileExists(t, filepath.Join(vols["talos"], "config"), "the deleted Secret's file is gone from its volume")
	assert.FileExists(t, filepath.Join(vols["scratch"], "written"), "the emptyDir keeps what the containers wrote")
}

// startTerminating runs a simulated pod on worker-1, whose pods take takes to
// stop (terminationTakes), until it runs, then deletes it (grace 30s); the
// kubelet logs to log (nil: nowhere). It
// returns its runner, a channel closed once the runner ended, and the events
// file the kubelet writes.
func startTerminating(t *testing.T, takes time.Duration, log *slog.Logger) (*podRunner, *fake.Clientset, <-chan struct{}, string) {
	t.Helper()

	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	path := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(path, []byte("nodes:\n  worker-1:\n    terminationTakes: "+takes.String()+"\n"), 0o644))
	store, err := faults.Load(path)
	require.NoError(t, err)

	evPath := filepath.Join(t.TempDir(), "events.jsonl")
	evLog, err := events.Open(evPath)
	require.NoError(t, err)
	t.Cleanup(func() { _ = evLog.Close() })

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "6a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"},
		Spec:       corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "web", Image: "registry.local/web:v1"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
	client := fake.NewClientset(pod)
	k := &Kubelets{opts: Options{Client: client, Log: log, Faults: store, Events: evLog, PodStart: 10 * time.Millisecond, Ready: 10 * time.Millisecond},
		nodes: map[string]*node{}, pods: map[string]*podRunner{}}
	n := newNode(k, fakeMachine{name: "worker-1", ip: netip.MustParseAddr("127.0.0.10")})
	n.running.Store(true)
	r := newPodRunner(k, n, pod)
	r.update(pod)

	ended := make(chan struct{})
	go func() {
		r.run(ctx)
		close(ended)
	}()

	require.Eventually(t, func() bool {
		got, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.PodRunning
	}, 5*time.Second, 10*time.Millisecond, "running first")

	got, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	require.NoError(t, err)
	now, grace := metav1.Now(), int64(30)
	got.DeletionTimestamp, got.DeletionGracePeriodSeconds = &now, &grace
	r.update(got)

	return r, client, ended, evPath
}

// A simulated pod runs on, Terminating, for the node's terminationTakes once
// deleted (not at all without the fault), and says it finished its work.
func TestTerminationTakes(t *testing.T) {
	for _, takes := range []time.Duration{0, 400 * time.Millisecond} {
		deleted := time.Now()
		_, client, ended, evPath := startTerminating(t, takes, nil)

		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("takes %s: the pod did not end", takes)
		}

		_, err := client.CoreV1().Pods("default").Get(context.Background(), "web", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "takes %s: gone once it ended: %v", takes, err)
		assert.GreaterOrEqual(t, time.Since(deleted), takes, "it ran on, Terminating, for what the fault says")

		evs, err := events.Read(evPath)
		require.NoError(t, err)
		if takes > 0 {
			require.Len(t, evs, 1)
			assert.Equal(t, events.Event{Time: evs[0].Time, Node: "worker-1", Component: events.PodStopped, Version: "default/web"}, evs[0])
		} else {
			assert.Empty(t, evs, "a pod that stops at once has no work to finish")
		}
	}
}

// A reboot of its node while a pod finishes its work cuts it short, and the
// simulator records it (events.PodCut): what a drain before a reboot exists
// to prevent.
func TestTerminationCutByReboot(t *testing.T) {
	working := &onMessage{msg: "terminating: the pod finishes its work", seen: make(chan struct{})}
	r, _, ended, evPath := startTerminating(t, time.Minute, slog.New(working))

	// The pod is Terminating, its work under way, when the machine goes down.
	select {
	case <-working.seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod did not start its work on SIGTERM")
	}

	r.nodeDown()

	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the pod did not end when its node went down")
	}

	evs, err := events.Read(evPath)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, events.PodCut, evs[0].Component)
	assert.Equal(t, "default/web", evs[0].Version)
}

// onMessage is a slog.Handler that closes seen at the first record of msg.
type onMessage struct {
	msg  string
	seen chan struct{}
	once sync.Once
}

func (h *onMessage) Enabled(context.Context, slog.Level) bool { return true }
func (h *onMessage) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *onMessage) WithGroup(string) slog.Handler            { return h }

func (h *onMessage) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	return nil
}
