package job

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

// engineFunc is an Engine made of a function.
type engineFunc func(ctx context.Context) error

func (f engineFunc) Run(ctx context.Context) error { return f(ctx) }

// syncBuffer is a bytes.Buffer safe for the runner's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.b.String()
}

type runnerFixture struct {
	client *fake.Clientset
	runner *Runner
	out    *syncBuffer
	cfg    EngineConfig
}

// newRunner is a runner of op against a fake cluster, with short lock timings, whose
// engine is run.
func newRunner(t *testing.T, op *api.Operation, run func(ctx context.Context, cfg EngineConfig) error, objs ...runtime.Object) *runnerFixture {
	t.Helper()

	objs = append(objs,
		stateObject(t, op),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1", UID: "uid-cp-1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "runner-pod-1", Namespace: "ichor-system"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
	)

	f := &runnerFixture{client: fake.NewClientset(objs...), out: &syncBuffer{}}
	withResourceVersions(f.client, leasesResource, configmapsResource)
	f.runner = &Runner{
		Kube: f.client, Namespace: "ichor-system", Operation: op.Spec.ID,
		Identity: "runner-pod-1", Node: "cp-2", Out: f.out,
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
		NewEngine: func(_ context.Context, cfg EngineConfig) (Engine, func(), error) {
			f.cfg = cfg

			return engineFunc(func(ctx context.Context) error { return run(ctx, cfg) }), nil, nil
		},
	}

	return f
}

func (f *runnerFixture) state(t *testing.T) *api.Operation {
	t.Helper()

	op, _, err := (&Store{Client: f.client.CoreV1(), Namespace: "ichor-system"}).Get(context.Background())
	require.NoError(t, err)

	return op
}

func (f *runnerFixture) lease(t *testing.T) *coordinationv1.Lease {
	t.Helper()

	l, err := f.client.CoordinationV1().Leases(LockNamespace).Get(context.Background(), LockName, metav1.GetOptions{})
	require.NoError(t, err)

	return l
}

func exitCode(err error) int {
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}

	if err != nil {
		return 1
	}

	return 0
}

func TestRunnerSucceeds(t *testing.T) {
	op := testOperation("op-1", api.PhasePending)
	op.Spec.Timeouts.Drain = api.NewTimeout(7 * time.Minute)
	op.Spec.Timeouts.Pull = api.NewTimeout(3 * time.Minute)
	op.Spec.PullConcurrency = 8

	var (
		memoDurable bool
		cachedNode  bool
	)

	var f *runnerFixture

	f = newRunner(t, op, func(ctx context.Context, cfg EngineConfig) error {
		// The runner's watch of the Nodes, started once, is the engine's.
		if cfg.Nodes != nil {
			_, cachedNode = cfg.Nodes.Cached("cp-1")
		}

		cfg.Progress.Stage(1, 4, "APIServers")
		cfg.Progress.Node("APIServers", "cp-1", engine.PhaseApplying, "apply kube-apiserver v1.36.3")

		if err := cfg.Memo.Set(ctx, "boot/cp-1", "b-1"); err != nil {
			return err
		}

		// Set returns once the value is in the ConfigMap.
		memoDurable = f.state(t).Status.Memo["boot/cp-1"] == "b-1"

		v, found := cfg.Memo.Get("boot/cp-1")
		assert.True(t, found)
		assert.Equal(t, "b-1", v)

		cfg.Progress.Node("APIServers", "cp-1", engine.PhaseDone, "kube-apiserver v1.36.3 Ready")
		cfg.Progress.(engine.StepTimer).StepTime("KubeProxy", engine.StepManifests, engine.StepTiming{Done: true})
		cfg.Progress.(engine.StepProgress).Step("KubeProxy", engine.StepManifests, "applied 10 objects")
		cfg.Progress.(engine.StepProgress).Step("KubeProxy", "rollout", "kube-proxy rolled out")
		cfg.Progress.Stage(4, 4, "Kubelets")

		return nil
	})

	ctx := context.Background()

	for _, obj := range append(RunnerObjects("ichor-system", ManifestAccess{}, nil)[:1], talosSecret()) {
		require.NoError(t, f.client.Tracker().Add(obj))
	}

	f.client.ClearActions()

	err := f.runner.Run(ctx)
	require.NoError(t, err, f.out.String())

	assert.True(t, cachedNode, "the engine is given the runner's watch of the Nodes")

	nodeReads := map[string]int{}

	for _, a := range f.client.Actions() {
		if a.GetResource().Resource == "nodes" {
			nodeReads[a.GetVerb()]++
		}
	}

	assert.Equal(t, map[string]int{"list": 1, "watch": 1}, nodeReads, "one watch of the Nodes; the events' Node UID from it, no GET")

	// Its credentials go once it succeeded: the Secret of the talos.dev ServiceAccount, and
	// its ClusterRole, which owns the rest.
	_, err = f.client.RbacV1().ClusterRoles().Get(ctx, ClusterRoleName("ichor-system"), metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the runner's ClusterRole is deleted")
	_, err = f.client.CoreV1().Secrets("ichor-system").Get(ctx, TalosAccountName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the os:admin talosconfig is deleted")
	assert.Contains(t, f.out.String(), "deleted clusterrole ichor-runner:ichor-system")

	assert.True(t, memoDurable)
	opts := f.cfg.Options
	assert.NotNil(t, opts.HandOver, "the runner hands over before its node's reboot")
	opts.HandOver = nil
	assert.Equal(t, engine.Options{
		Kind: engine.KindKubernetes, Target: "v1.36.3", MaxUnavailable: 1, Self: "cp-2", SelfPod: "ichor-system/runner-pod-1", DrainTimeout: 7 * time.Minute,
		PullTimeout: 3 * time.Minute, PullConcurrency: 8,
	}, opts, "the runner's own pod is evicted last on its node")

	s := f.state(t).Status
	assert.Equal(t, api.PhaseSucceeded, s.Phase)
	assert.Equal(t, "runner-pod-1", s.Runner)
	assert.Equal(t, 1, s.Runs)
	assert.Equal(t, "Kubelets", s.Stage)
	assert.Equal(t, 4, s.StageCount)
	assert.Empty(t, s.Step, "a stage's steps end with it")
	assert.Equal(t, "applied 10 objects", s.Manifests, "what the manifest sync did stays")
	require.NotNil(t, s.StepOf("KubeProxy", engine.StepManifests), "the step's times are in the state")
	assert.NotNil(t, s.StepOf("KubeProxy", engine.StepManifests).Done)
	require.Len(t, s.Runners, 1)
	assert.Equal(t, "runner-pod-1", s.Runners[0].Pod)
	assert.Equal(t, "cp-2", s.Runners[0].Node)
	assert.NotNil(t, s.Runners[0].Ended, "its end is recorded")
	assert.NotNil(t, s.StartedAt)
	assert.NotNil(t, s.FinishedAt)
	require.Len(t, s.Nodes, 1)
	assert.Equal(t, string(engine.PhaseDone), s.Nodes[0].Phase)
	assert.Equal(t, "kube-apiserver v1.36.3 Ready", s.Nodes[0].Message)

	assert.Empty(t, leaseHolderOf(f.lease(t)), "the lock is released")

	// One event per step: about the Node in default, about the operation in its namespace.
	nodeEvents, err := f.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	var reasons []string
	for _, e := range nodeEvents.Items {
		assert.Equal(t, "Node", e.InvolvedObject.Kind)
		assert.Equal(t, "uid-cp-1", string(e.InvolvedObject.UID))
		reasons = append(reasons, e.Reason)
	}

	assert.ElementsMatch(t, []string{"Applying", "Done"}, reasons)

	opEvents, err := f.client.CoreV1().Events("ichor-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	reasons = nil
	for _, e := range opEvents.Items {
		reasons = append(reasons, e.Reason)
	}

	assert.ElementsMatch(t, []string{"Running", "Stage", "Step", "Step", "Stage", "Succeeded"}, reasons)
}

func leaseHolderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}

	return *l.Spec.HolderIdentity
}

func TestRunnerPauses(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		reason     string
		action     string
		pausedNode string
	}{
		{
			name:   "pause error",
			err:    &engine.PauseError{Stage: "Kubelets", Node: "worker-1", Reason: "node NotReady after 20m0s", Action: "look at worker-1's kubelet, then kubectl ichor resume"},
			reason: "node NotReady after 20m0s", action: "look at worker-1's kubelet, then kubectl ichor resume", pausedNode: "worker-1",
		},
		{
			name: "any other error", err: errors.New("talos: connection refused"),
			reason: "talos: connection refused", action: "read the runner's log (kubectl ichor logs), fix the cause, then kubectl ichor resume",
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newRunner(t, testOperation("op-1", api.PhasePending), func(context.Context, EngineConfig) error { return tt.err })

			err := f.runner.Run(context.Background())
			assert.Equal(t, ExitPaused, exitCode(err), "%v", err)

			s := f.state(t).Status
			assert.Equal(t, api.PhasePaused, s.Phase)
			assert.Equal(t, tt.reason, s.Reason)
			assert.Equal(t, tt.action, s.Action)
			assert.Equal(t, tt.pausedNode, s.PausedNode)
			assert.Empty(t, leaseHolderOf(f.lease(t)))
			assert.Contains(t, f.out.String(), "Paused")
		})
	}
}

func TestRunnerStopsWhenAborted(t *testing.T) {
	var f *runnerFixture

	f = newRunner(t, testOperation("op-1", api.PhasePending), func(ctx context.Context, cfg EngineConfig) error {
		// kubectl ichor abort marks the operation while the engine works...
		_, err := (&Store{Client: f.client.CoreV1(), Namespace: "ichor-system"}).Update(ctx, func(o *api.Operation) error {
			o.Status.Phase = api.PhaseAborted

			return nil
		})
		require.NoError(t, err)

		// ...and the next write stops the engine.
		cfg.Progress.Node("Kubelets", "cp-1", engine.PhaseDraining, "evicting 3 pods")

		<-ctx.Done()

		return ctx.Err()
	})

	err := f.runner.Run(context.Background())
	assert.Equal(t, ExitFinal, exitCode(err), "%v", err)
	assert.Equal(t, api.PhaseAborted, f.state(t).Status.Phase, "the abort is kept")
	assert.Empty(t, f.state(t).Status.Nodes, "nothing is written after the abort")
}

func TestRunnerStoppedBySignal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	f := newRunner(t, testOperation("op-1", api.PhasePending), func(ectx context.Context, cfg EngineConfig) error {
		cfg.Progress.Node("Kubelets", "cp-1", engine.PhaseDraining, "evicting")
		cancel() // the pod is evicted

		<-ectx.Done()

		return ectx.Err()
	})

	err := f.runner.Run(ctx)
	assert.Equal(t, ExitStopped, exitCode(err), "%v", err)

	s := f.state(t).Status
	assert.Equal(t, api.PhaseRunning, s.Phase, "the next runner continues")
	require.Len(t, s.Nodes, 1, "the last progress is written")
	assert.Equal(t, string(engine.PhaseDraining), s.Nodes[0].Phase)
	require.Len(t, s.Runners, 1)
	assert.NotNil(t, s.Runners[0].Ended, "the runner's end is written: the next one measures its wait from it")
	assert.Empty(t, leaseHolderOf(f.lease(t)), "the lock is released for the next pod")
}

func TestRunnerLosesTheLock(t *testing.T) {
	var f *runnerFixture

	f = newRunner(t, testOperation("op-1", api.PhasePending), func(ctx context.Context, cfg EngineConfig) error {
		// Another holder takes the lease over (a partition ended, a clock jumped).
		l := f.lease(t)
		other, now := "other-pod", metav1.NewMicroTime(time.Now().Add(time.Hour))
		l.Spec.HolderIdentity, l.Spec.RenewTime = &other, &now
		_, err := f.client.CoordinationV1().Leases(LockNamespace).Update(ctx, l, metav1.UpdateOptions{})
		require.NoError(t, err)

		<-ctx.Done()

		// Nothing the engine reports from now on may be written.
		cfg.Progress.Node("Kubelets", "cp-1", engine.PhaseApplying, "too late")

		return ctx.Err()
	})

	start := time.Now()
	err := f.runner.Run(context.Background())
	assert.Equal(t, 1, exitCode(err), "%v", err)
	assert.ErrorIs(t, err, errLostLock)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, api.PhaseRunning, f.state(t).Status.Phase)
	assert.Empty(t, f.state(t).Status.Nodes)
	assert.Equal(t, "other-pod", leaseHolderOf(f.lease(t)))
}

func TestRunnerTakesOverFromAGoneHolder(t *testing.T) {
	holder, now, duration := "ichor-system/old-pod", metav1.NewMicroTime(time.Now()), int32(3600)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now, AcquireTime: &now, LeaseDurationSeconds: &duration},
	}
	oldPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "old-pod", Namespace: "ichor-system"}, Status: corev1.PodStatus{Phase: corev1.PodFailed}}

	ran := false
	f := newRunner(t, testOperation("op-1", api.PhaseRunning), func(context.Context, EngineConfig) error { ran = true; return nil }, lease, oldPod)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	require.NoError(t, f.runner.Run(ctx))
	assert.True(t, ran)
	assert.Contains(t, f.out.String(), "the lock's holder ichor-system/old-pod is gone: lock released")
	assert.Equal(t, 1, f.state(t).Status.Runs)
}

// A runner waiting on a live holder takes the lock the moment the holder lets it go (a
// hand-over's successor, as its predecessor releases it), not at its elector's next
// retry: here the retry is an hour away and the lock is taken all the same.
func TestRunnerTakesTheLockTheMomentItIsReleased(t *testing.T) {
	holder, now, duration := "ichor-system/first-pod", metav1.NewMicroTime(time.Now()), int32(3600)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now, LeaseDurationSeconds: &duration},
	}
	firstPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "first-pod", Namespace: "ichor-system"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}

	ran := false
	f := newRunner(t, testOperation("op-1", api.PhaseRunning), func(context.Context, EngineConfig) error { ran = true; return nil }, lease, firstPod)
	f.runner.LeaseDuration, f.runner.RenewDeadline, f.runner.RetryPeriod = 3*time.Hour, 2*time.Hour, time.Hour

	go func() {
		// The holder releases it once the waiting runner watches the Lease (the fake
		// clientset's watch starts from now, not from the resourceVersion read).
		for countActions(f.client.Actions(), "watch", "leases") == 0 {
			time.Sleep(10 * time.Millisecond)
		}

		lock, err := ReadLock(context.Background(), f.client)
		if assert.NoError(t, err) {
			assert.NoError(t, releaseLock(context.Background(), f.client, lock))
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	require.NoError(t, f.runner.Run(ctx))
	assert.True(t, ran)
	assert.Contains(t, f.out.String(), "the lock is held by ichor-system/first-pod: waiting for it")
}

// The lock is the cluster's: a live runner of an operation in another namespace keeps
// this one waiting.
func TestRunnerWaitsForALiveHolderThenGivesUpOnAbort(t *testing.T) {
	holder, now, duration := "upgrades/live-pod", metav1.NewMicroTime(time.Now().Add(time.Hour)), int32(3600)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &now, LeaseDurationSeconds: &duration},
	}
	livePod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "live-pod", Namespace: "upgrades"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}

	f := newRunner(t, testOperation("op-1", api.PhaseRunning), func(context.Context, EngineConfig) error {
		t.Error("the engine must not run without the lock")

		return nil
	}, lease, livePod)

	go func() {
		time.Sleep(500 * time.Millisecond)

		_, err := (&Store{Client: f.client.CoreV1(), Namespace: "ichor-system"}).Update(context.Background(), func(o *api.Operation) error {
			o.Status.Phase = api.PhaseAborted

			return nil
		})
		assert.NoError(t, err)
	}()

	err := f.runner.Run(context.Background())
	assert.Equal(t, ExitFinal, exitCode(err), "%v", err)
	assert.Contains(t, err.Error(), "was aborted")
	assert.Equal(t, "upgrades/live-pod", leaseHolderOf(f.lease(t)))
	assert.Contains(t, f.out.String(), "the lock is held by upgrades/live-pod: waiting for it (one operation per cluster)")
}

func TestRunnerRefuses(t *testing.T) {
	tests := []struct {
		name  string
		state func(t *testing.T) runtime.Object
		code  int
		want  string
	}{
		{
			name: "corrupted state", code: ExitFinal, want: "state configmap ichor-system/ichor-state is corrupted",
			state: func(*testing.T) runtime.Object {
				return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: StateName, Namespace: "ichor-system"}, BinaryData: map[string][]byte{OperationKey: []byte("{")}}
			},
		},
		{
			name: "replaced", code: ExitFinal, want: "operation op-1 was replaced by op-2",
			state: func(t *testing.T) runtime.Object { return stateObject(t, testOperation("op-2", api.PhaseRunning)) },
		},
		{
			name: "paused", code: ExitPaused, want: "is paused",
			state: func(t *testing.T) runtime.Object { return stateObject(t, testOperation("op-1", api.PhasePaused)) },
		},
		{
			name: "aborted", code: ExitFinal, want: "was aborted",
			state: func(t *testing.T) runtime.Object { return stateObject(t, testOperation("op-1", api.PhaseAborted)) },
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(tt.state(t))
			r := &Runner{
				Kube: client, Namespace: "ichor-system", Operation: "op-1", Identity: "p",
				NewEngine: func(context.Context, EngineConfig) (Engine, func(), error) {
					t.Error("no engine may be built")

					return nil, nil, errors.New("no")
				},
			}

			err := r.Run(context.Background())
			assert.Equal(t, tt.code, exitCode(err))
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestEngineOptionsCarryAllowEtcdOutage(t *testing.T) {
	for _, allow := range []bool{false, true} {
		spec := api.OperationSpec{Upgrade: api.UpgradeTalos, Target: "v1.13.9", MaxUnavailable: 1, AllowEtcdOutage: allow}
		opts := engineOptions(spec, spec.Runs()[0], "cp-1")
		if opts.AllowEtcdOutage != allow {
			t.Fatalf("spec allowEtcdOutage %v: engine option %v", allow, opts.AllowEtcdOutage)
		}
	}
}

// TestNodeEventsOnlyWhereLookedFor: a node's steps an operator looks for in `kubectl get
// events` (cordoned, its change begun, done) are events about the Node; pending,
// draining and verifying are only in the state and the log.
func TestNodeEventsOnlyWhereLookedFor(t *testing.T) {
	op := testOperation("op-1", api.PhasePending)

	f := newRunner(t, op, func(_ context.Context, cfg EngineConfig) error {
		for _, phase := range []engine.NodePhase{
			engine.PhasePending, engine.PhaseCordoned, engine.PhaseDraining, engine.PhaseApplying, engine.PhaseVerifying, engine.PhaseDone,
		} {
			cfg.Progress.Node("Kubelets", "cp-1", phase, "step "+string(phase))
		}

		return nil
	})

	require.NoError(t, f.runner.Run(context.Background()), f.out.String())

	events, err := f.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	var reasons []string
	for _, e := range events.Items {
		reasons = append(reasons, e.Reason)
	}

	assert.ElementsMatch(t, []string{"Cordoned", "Applying", "Done"}, reasons)

	nodes := f.state(t).Status.Nodes
	require.Len(t, nodes, 1)
	assert.Equal(t, "step Done", nodes[0].Message, "the state has every step")
}

// TestProgressWritesCoalesce: progress that comes in a burst (a batch of nodes entering
// a phase) is written in a few writes of the state, not one per change; a value the
// engine waits for (Memo.Set) is in the state when Set returns.
func TestProgressWritesCoalesce(t *testing.T) {
	op := testOperation("op-1", api.PhasePending)

	var f *runnerFixture

	f = newRunner(t, op, func(ctx context.Context, cfg EngineConfig) error {
		before := configMapUpdates(f)

		// A change every 4ms, as a batch's nodes report one after another.
		for i := range 100 {
			cfg.Progress.Node("Kubelets", fmt.Sprintf("worker-%d", i), engine.PhaseApplying, "apply kubelet v1.36.3")
			time.Sleep(4 * time.Millisecond)
		}

		if err := cfg.Memo.Set(ctx, "k", "v"); err != nil {
			return err
		}

		state := f.state(t).Status
		assert.Len(t, state.Nodes, 100, "every change is in the state once Set returned")
		assert.Equal(t, "v", state.Memo["k"])
		assert.LessOrEqual(t, configMapUpdates(f)-before, 5, "100 changes over 400ms and a Set in a few writes")

		return nil
	})

	require.NoError(t, f.runner.Run(context.Background()), f.out.String())
}

// configMapUpdates counts the state writes the fake cluster took.
func configMapUpdates(f *runnerFixture) int {
	n := 0

	for _, a := range f.client.Actions() {
		if a.GetVerb() == "update" && a.GetResource().Resource == "configmaps" {
			n++
		}
	}

	return n
}

// TestRunnerStartedAfterTheEnd: a runner's container restarted after its operation's
// end (its node's new kubelet restarted it a moment after the runner saw that node
// Ready, wrote Succeeded and removed its credentials) starts without its Talos
// credentials, and its RBAC is gone too. It exits 0, which ends the Job, where it
// used to stay in ContainerCreating. A runner that finds its credentials gone while
// the operation still runs stops for good, saying how to write them again.
func TestRunnerStartedAfterTheEnd(t *testing.T) {
	forbidden := func(client *fake.Clientset) {
		client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), StateName,
				errors.New(`User "system:serviceaccount:ichor-system:ichor-runner" cannot get resource "configmaps"`))
		})
	}

	tests := []struct {
		name          string
		phase         api.Phase
		rbacGone      bool
		noCredentials bool
		code          int
		want          string
	}{
		{name: "its rights gone", phase: api.PhaseSucceeded, rbacGone: true, noCredentials: true, code: 0,
			want: "operation op-1 ended: its runner's credentials were removed; nothing to do (kubectl ichor status says how it ended)"},
		{name: "its rights not yet gone", phase: api.PhaseSucceeded, noCredentials: true, code: 0, want: "operation op-1 already succeeded"},
		{name: "forbidden with its credentials", phase: api.PhaseRunning, rbacGone: true, code: 1, want: "is forbidden"},
		{name: "credentials gone while it runs", phase: api.PhaseRunning, noCredentials: true, code: ExitFinal,
			want: "operation op-1 is Running but the runner's Talos credentials (secret ichor-system/ichor-talos) are gone: kubectl ichor resume writes them again"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(stateObject(t, testOperation("op-1", tt.phase)))
			if tt.rbacGone {
				forbidden(client)
			}

			r := &Runner{
				Kube: client, Namespace: "ichor-system", Operation: "op-1", Identity: "p", NoCredentials: tt.noCredentials,
				NewEngine: func(context.Context, EngineConfig) (Engine, func(), error) {
					t.Error("no engine may be built")

					return nil, nil, errors.New("no")
				},
			}

			err := r.Run(context.Background())
			require.Error(t, err)
			assert.Equal(t, tt.code, exitCode(err))
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}
