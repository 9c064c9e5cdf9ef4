package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

// TestRunnerFencesMemoOnTheState: another runner took the Lease early (this one's pod
// looked gone) and named itself the state's runner, while this one's elector has not
// noticed yet: the engine's Memo.Set at that moment writes nothing and fails, and the
// runner stops as having lost the lock. The fence is the state's own: no Lease read.
func TestRunnerFencesMemoOnTheState(t *testing.T) {
	var (
		f      *runnerFixture
		setErr error
	)

	f = newRunner(t, testOperation("op-1", api.PhasePending), func(ctx context.Context, cfg EngineConfig) error {
		l := f.lease(t)
		other, now := HolderIdentity("ichor-system", "other-pod"), metav1.NewMicroTime(time.Now().Add(time.Hour))
		l.Spec.HolderIdentity, l.Spec.RenewTime = &other, &now
		_, err := f.client.CoordinationV1().Leases(LockNamespace).Update(ctx, l, metav1.UpdateOptions{})
		require.NoError(t, err)

		successor := &Store{Client: f.client.CoreV1(), Namespace: "ichor-system"}
		_, err = successor.Update(ctx, func(o *api.Operation) error {
			o.Status.Runner = "other-pod"

			return nil
		})
		require.NoError(t, err)

		leaseGets := countActions(f.client.Actions(), "get", "leases")

		// At once, before the elector's next renewal.
		setErr = cfg.Memo.Set(ctx, "talos/cp-1/v1.13.9", `{"bootID":"b","step":"install"}`)

		assert.Equal(t, leaseGets, countActions(f.client.Actions(), "get", "leases"), "the write read no Lease")

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return errors.New("the engine was not stopped a minute after the lock was lost")
		}
	})
	// No renewal comes in the test's few milliseconds, so the Lease reads counted
	// around the write are the write's own: with a 4s retry period, a machine
	// under load saw the elector's renewal fall inside that window.
	f.runner.LeaseDuration, f.runner.RenewDeadline, f.runner.RetryPeriod = time.Minute, 50*time.Second, 40*time.Second

	err := f.runner.Run(context.Background())
	require.ErrorIs(t, setErr, errLostLock)
	assert.ErrorContains(t, setErr, "runner other-pod took operation op-1 over")
	assert.ErrorIs(t, err, errLostLock)
	assert.Empty(t, f.state(t).Status.Memo, "nothing written without the lock")
	assert.Equal(t, "other-pod", f.state(t).Status.Runner)
	assert.Equal(t, HolderIdentity("ichor-system", "other-pod"), leaseHolderOf(f.lease(t)))
}

// TestRunnerStopsWhenTheLeaseIsTaken: another runner took the Lease and has not yet
// named itself in the state: the elector sees the new holder at its next renewal and
// the engine is stopped before the successor acts, and the runner ends without writing.
func TestRunnerStopsWhenTheLeaseIsTaken(t *testing.T) {
	var f *runnerFixture

	f = newRunner(t, testOperation("op-1", api.PhasePending), func(ctx context.Context, cfg EngineConfig) error {
		l := f.lease(t)
		other, now := HolderIdentity("ichor-system", "other-pod"), metav1.NewMicroTime(time.Now().Add(time.Hour))
		l.Spec.HolderIdentity, l.Spec.RenewTime = &other, &now
		_, err := f.client.CoordinationV1().Leases(LockNamespace).Update(ctx, l, metav1.UpdateOptions{})
		require.NoError(t, err)

		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return errors.New("the engine was not stopped a minute after the lock was lost")
		}
	})
	f.runner.LeaseDuration, f.runner.RenewDeadline, f.runner.RetryPeriod = 10*time.Second, 8*time.Second, time.Second

	err := f.runner.Run(context.Background())
	assert.ErrorIs(t, err, errLostLock)
	assert.Equal(t, api.PhaseRunning, f.state(t).Status.Phase, "the runner that lost the lock wrote no end")
	assert.Equal(t, HolderIdentity("ichor-system", "other-pod"), leaseHolderOf(f.lease(t)))
}

// countActions counts the fake client's actions of verb on resource.
func countActions(actions []k8stesting.Action, verb, resource string) int {
	n := 0

	for _, a := range actions {
		if a.GetVerb() == verb && a.GetResource().Resource == resource {
			n++
		}
	}

	return n
}

// TestRunnerMemoSetHasADeadline: the apiserver refuses every update of the state (an
// admission webhook's 403): Memo.Set returns with the refusal after its deadline instead
// of blocking, and the engine's pause, which cannot be written either, is said in an
// Event.
func TestRunnerMemoSetHasADeadline(t *testing.T) {
	var setErr error

	f := newRunner(t, testOperation("op-1", api.PhasePending), func(ctx context.Context, cfg EngineConfig) error {
		setErr = cfg.Memo.Set(ctx, "talos/cp-1/v1.13.9", `{"bootID":"b","step":"install"}`)

		return &engine.PauseError{Stage: "TalosOS", Node: "cp-1", Reason: "record the install step: " + setErr.Error(), Action: "fix it, then resume", Err: setErr}
	})

	refusing := false
	f.client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !refusing {
			return false, nil, nil
		}

		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, StateName,
			errors.New(`admission webhook "deny.example.com" denied the request`))
	})

	f.runner.StateWriteTimeout = 2 * time.Second

	// Refuse once the runner took the operation over (its first write).
	f.runner.NewEngine = wrapEngine(f.runner.NewEngine, func() { refusing = true })

	start := time.Now()
	err := f.runner.Run(context.Background())
	require.Error(t, setErr)
	assert.Contains(t, setErr.Error(), "the state ConfigMap was not written within")
	assert.Contains(t, setErr.Error(), "denied the request")
	assert.Contains(t, setErr.Error(), "within 2s")
	assert.Less(t, time.Since(start), 30*time.Second)
	assert.Error(t, err)
	assert.NotEqual(t, ExitPaused, exitCode(err), "the pause is not in the state: the Job's next pod tries again")
	assert.Empty(t, f.state(t).Status.Memo)

	evs, lerr := f.client.CoreV1().Events("ichor-system").List(context.Background(), metav1.ListOptions{})
	require.NoError(t, lerr)

	var found bool

	for _, e := range evs.Items {
		if e.Reason == "PauseNotRecorded" {
			found = true

			assert.Contains(t, e.Message, "cp-1")
			assert.Contains(t, e.Message, "the state could not be written")
		}
	}

	assert.True(t, found, "an Event says the pause")
}

// wrapEngine calls before when the runner creates its engine.
func wrapEngine(next EngineFactory, before func()) EngineFactory {
	return func(ctx context.Context, cfg EngineConfig) (Engine, func(), error) {
		before()

		return next(ctx, cfg)
	}
}
