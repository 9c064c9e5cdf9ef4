package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// TestTalosResumesFromAnyPoint stops an upgrade after every possible number
// of progress events, then runs a fresh engine with the same Memo (as the
// next runner pod reads it from the state): it must finish, call Upgrade
// once per node, and leave nothing cordoned.
func TestTalosResumesFromAnyPoint(t *testing.T) {
	spec := clusterSpec{controlPlanes: 2, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4", workloads: 1}

	ref := newFakeOS(t, spec)
	all := &recorder{}
	e := ref.engine("v1.13.9", newMemo(), func(o *Options) { o.MaxUnavailable = 2 })
	e.Progress = all
	require.NoError(t, e.Run(context.Background()))

	total := len(all.all())
	require.Greater(t, total, 30)

	for stopAt := 1; stopAt <= total; stopAt++ {
		t.Run(fmt.Sprintf("after %d of %d", stopAt, total), func(t *testing.T) {
			t.Parallel()

			o := newFakeOS(t, spec)
			memo := newMemo()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			first := o.engine("v1.13.9", memo, func(opts *Options) { opts.MaxUnavailable = 2 })
			first.Progress = &recorder{stopAt: stopAt, cancel: cancel}

			if err := first.Run(ctx); err != nil {
				require.ErrorIs(t, err, context.Canceled, "a stop is not a pause: %v", err)

				var pause *PauseError
				require.False(t, errors.As(err, &pause))
			}

			require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
			requireTalosFinished(t, o, "v1.13.9")
			assert.Len(t, o.upgradeNodes(), 4, "one Upgrade per node: %v", o.upgradeNodes())
		})
	}
}

// TestTalosResumes stops the runner at the points where a real one dies:
// mid-call once the node has taken the upgrade, right after the call before
// the state says so, and on the runner's own node's reboot; the next runner
// (on another node) follows the node from its recorded boot ID.
func TestTalosResumes(t *testing.T) {
	for _, tc := range []struct {
		name string
		// stop returns the hook that stops the first run, given its cancel.
		hook func(cancel context.CancelFunc) func(ctx context.Context, node string) (bool, error)
		line string // or the progress line that stops it
		// faults, when set, are worker-2's in the first run only.
		faults func(*osFaults)
	}{
		{
			name: "killed mid-call, the node upgrading",
			hook: func(cancel context.CancelFunc) func(context.Context, string) (bool, error) {
				return func(_ context.Context, node string) (bool, error) {
					if node != "worker-2" {
						return false, nil
					}

					cancel()

					return false, context.Canceled
				}
			},
		},
		{
			name: "killed after the call, before the state recorded it",
			hook: func(cancel context.CancelFunc) func(context.Context, string) (bool, error) {
				return func(_ context.Context, node string) (bool, error) {
					if node == "worker-2" {
						cancel()
					}

					return false, nil
				}
			},
		},
		{name: "killed with the boot ID recorded, before the call", line: "TalosOS worker-2 Upgrading: upgrading Talos"},
		{name: "the runner's node reboots under it", line: "TalosOS worker-2 Upgrading: rebooting"},
		{
			name: "killed while verifying", line: "TalosOS worker-2 Verifying: waiting for",
			faults: func(f *osFaults) { f.stayNotReady = true },
		},
		{name: "killed while draining", line: "TalosOS worker-2 Draining: draining"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newFakeOS(t, talosSpec())
			memo := newMemo()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			var rec Progress = &recorder{}
			if tc.line != "" {
				rec = stopOnLine{recorder: &recorder{}, prefix: tc.line, cancel: cancel}
			}

			if tc.hook != nil {
				o.onUpgrade = tc.hook(cancel)
			}

			if tc.faults != nil {
				o.setFaults("worker-2", tc.faults)
			}

			first := o.engine("v1.13.9", memo, func(opts *Options) { opts.Self = "worker-2" })
			first.Progress = rec

			err := first.Run(ctx)
			require.ErrorIs(t, err, context.Canceled)
			assert.Equal(t, []string{"worker-2"}, o.f.cordonedByIchor(), "the runner's node stays cordoned by ichor")

			o.onUpgrade = nil

			if tc.faults != nil {
				o.setFaults("worker-2", func(f *osFaults) { *f = osFaults{} })
				o.setNode("worker-2", func(n *corev1.Node) {
					n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
				})
			}

			// The Job's next pod runs on worker-1, with the state's Memo. The killed
			// run's reboot of worker-2 may still be going down (the fake's lag), and
			// the new run verifies it once it is back: a bound that a loaded machine
			// cannot miss.
			next := &recorder{}
			e := o.engine("v1.13.9", memo, func(opts *Options) { opts.Self, opts.VerifyTimeout = "worker-1", 30*time.Second })
			e.Progress = next

			require.NoError(t, e.Run(context.Background()))
			requireTalosFinished(t, o, "v1.13.9")
			assert.Len(t, o.upgradeNodes(), 5, "one Upgrade per node: %v", o.upgradeNodes())
			assert.Contains(t, next.with("TalosOS worker-")[0], "worker-2", "the node under way is finished first")
		})
	}
}

// TestTalosResumeKeepsTheBatchUnderWay stops the runner in its second
// worker batch, on its own node's drain; the next runner, on a worker the
// first batch upgraded, takes the nodes left cordoned in its first batch,
// together. The finished workers (on the target, their marks still reading
// "reboot") were counted under way too, and split the batch left half done.
func TestTalosResumeKeepsTheBatchUnderWay(t *testing.T) {
	spec := clusterSpec{controlPlanes: 1, workers: 4, kubernetes: "v1.35.4", talos: "v1.12.4", workloads: 1}
	o := newFakeOS(t, spec)
	memo := newMemo()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	first := o.engine("v1.13.9", memo, func(opts *Options) { opts.Self, opts.MaxUnavailable = "worker-4", 2 })
	first.Progress = stopOnLine{recorder: &recorder{}, prefix: "TalosOS worker-4 Draining: draining", cancel: cancel}
	require.ErrorIs(t, first.Run(ctx), context.Canceled)

	left := o.f.cordonedByIchor()
	require.Contains(t, left, "worker-4")
	assert.Equal(t, "v1.13.9", o.state("worker-1").version, "the first batch finished")
	assert.Equal(t, "v1.13.9", o.state("worker-2").version, "the first batch finished")

	// The Job's next pod runs on worker-1.
	e := o.engine("v1.13.9", memo, func(opts *Options) { opts.Self, opts.MaxUnavailable = "worker-1", 2 })
	e.Progress = &recorder{}

	c, err := e.startCache(context.Background())
	require.NoError(t, err)
	defer c.Stop()

	target, err := stages.ParseVersion("v1.13.9")
	require.NoError(t, err)

	r := &talosRun{e: e, opts: e.Options.withDefaults(), target: target, stage: stages.TalosOS{Target: target}, cache: c, poll: time.Millisecond}
	groups, _, err := r.observe(context.Background())
	require.NoError(t, err)
	require.Len(t, groups, 3, "cp-1, then two batches of two workers")

	var batch []string
	for _, n := range groups[1] {
		batch = append(batch, n.Name)
	}

	assert.Subset(t, batch, left, "the nodes left cordoned go on together, first")

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
}

// stopOnLine is a recorder that ends a run when a node's line starts with
// prefix.
type stopOnLine struct {
	*recorder

	prefix string
	cancel context.CancelFunc
}

func (s stopOnLine) Node(stage, node string, phase NodePhase, message string) {
	s.recorder.Node(stage, node, phase, message)

	if strings.HasPrefix(fmt.Sprintf("%s %s %s: %s", stage, node, phase, message), s.prefix) {
		s.cancel()
	}
}
