package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func TestLowerBound(t *testing.T) {
	tests := []struct {
		name                     string
		cps, workers, maxUnavail int
		ds                       time.Duration
		want                     float64
	}{
		// 0.3 + 0.2 + 2 x 3 x 3 + 3 + 23 x 1.3 + 3 x 5 + 4 x 2: one pre-pull (the later
		// stages' pull while the stage before runs), no replacement of the runner
		{name: "3+20, 5 at a time", cps: 3, workers: 20, maxUnavail: 5, want: 74.4},
		// 0.3 + 0.2 + 18 + 3 + 8 x 1.3 + 15 + 1 x 2
		{name: "3+5, 5 at a time", cps: 3, workers: 5, maxUnavail: 5, want: 48.9},
		// a last batch of one worker is a batch
		{name: "3+6, 5 at a time", cps: 3, workers: 6, maxUnavail: 5, want: 52.2},
		// the DaemonSet controller's measured pace, 2 s a pod: 23 x 2 for the rollout
		{name: "3+20, the rollout at its measured pace", cps: 3, workers: 20, maxUnavail: 5, ds: 2 * time.Second, want: 90.5},
		// a pace under a pod's own T + PS + RL cannot be: the latencies stand
		{name: "3+20, a pace under the latencies", cps: 3, workers: 20, maxUnavail: 5, ds: time.Second, want: 74.4},
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.InDelta(t, tc.want, lowerBound(benchLatencies, tc.cps, tc.workers, tc.maxUnavail, tc.ds).Seconds, 1e-9)
		})
	}
}

func TestDaemonSetPace(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	start := func(node, version string, s float64) events.Event {
		return events.Event{Time: t0.Add(time.Duration(s * float64(time.Second))), Node: node, Component: events.KubeProxy, Version: version}
	}

	// Starts on the target at 0, 1.5, 3.5 and 5 (out of order in the
	// log), one on the old version and an apiserver's between them.
	evs := []events.Event{
		start("n-1", toVersion, 0), start("n-3", toVersion, 3.5), start("n-0", "v1.36.3", 0.5),
		{Time: t0.Add(time.Second), Node: "n-1", Component: events.APIServer, Version: toVersion},
		start("n-2", toVersion, 1.5), start("n-4", toVersion, 5),
	}

	assert.Equal(t, 1500*time.Millisecond, daemonSetPace(evs), "the median of 1.5, 2 and 1.5")
	assert.Zero(t, daemonSetPace(evs[:1]), "one start: no pace")
}

func TestGroupsMoveTheRunnersNodeLast(t *testing.T) {
	step := func(name, role string) api.NodeStep { return api.NodeStep{Node: name, Role: role} }
	s := api.Stage{Nodes: []api.NodeStep{
		step("cp-1", api.RoleControlPlane), step("cp-2", api.RoleControlPlane),
		step("w-1", api.RoleWorker), step("w-2", api.RoleWorker), step("w-3", api.RoleWorker),
	}}

	var got []string
	for _, g := range groups(s, "w-1", 2) {
		got = append(got, g.String())
	}

	assert.Equal(t, []string{"cp-1", "cp-2", "[w-2 w-3]", "w-1"}, got)
}

func TestUpgradeSizesWithTheirOwnMaxUnavailable(t *testing.T) {
	sizes, mu, err := parseUpgradeSizes("--upgrade-sizes", "8, 23,103:10")
	assert.NoError(t, err)
	assert.Equal(t, []int{8, 23, 103}, sizes)

	o := options{maxUnavailable: 5, sizeMU: mu}
	assert.Equal(t, 5, o.muFor(23))
	assert.Equal(t, 10, o.muFor(103))

	for _, bad := range []string{"103:0", "103:x", "2", "x:10"} {
		_, _, err := parseUpgradeSizes("--upgrade-sizes", bad)
		assert.Error(t, err, bad)
	}
}

func TestTalosBound(t *testing.T) {
	// 0.3 + 0.2 + 3 x (0 + 0.2 + 3 + 1) + 4 x 4.2
	assert.InDelta(t, 29.9, talosBound(benchLatencies, 3, 20, 5).Seconds, 1e-9)
	// a last batch of one worker is a batch: 0.5 + 3 x 4.2 + 2 x 4.2
	assert.InDelta(t, 21.5, talosBound(benchLatencies, 3, 6, 5).Seconds, 1e-9)

	// Pods that take 2s to stop, on the workers: each batch installs beside
	// them, max(2, 0.2); a control plane evicts nothing.
	// 0.3 + 0.2 + 3 x 4.2 + 4 x (2 + 3 + 1)
	slow := benchLatencies
	slow.PodTermination = 2 * time.Second
	assert.InDelta(t, 37.1, talosBound(slow, 3, 20, 5).Seconds, 1e-9)
}

func TestPodTerminationFaults(t *testing.T) {
	path, err := podTerminationFaults(t.TempDir(), 5, 1500*time.Millisecond)
	require.NoError(t, err)

	store, err := faults.Load(path)
	require.NoError(t, err)

	for _, node := range []string{"cp-1", "cp-3", "worker-1", "worker-2"} {
		assert.Equal(t, 1500*time.Millisecond, store.For(node).TerminationTakes.Duration, node)
	}

	assert.Zero(t, store.For("worker-3").TerminationTakes.Duration, "5 nodes: 3 control planes, 2 workers")
}

func TestTalosVerifiedAt(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	step := api.NodeStep{Node: "cp-2", Role: api.RoleControlPlane, Changes: []api.Change{
		{Component: events.Talos, From: talosFrom, To: talosTo},
		{Component: "installer", From: "ghcr.io/siderolabs/installer:" + talosFrom, To: "factory.talos.dev/installer/abc:" + talosTo},
	}}
	evs := []events.Event{
		{Time: at(0), Node: "cp-2", Component: events.Kubelet, Version: "v1.36.3"}, // the boot before
		{Time: at(1), Node: "cp-1", Component: events.Talos, Version: talosTo},     // another node
		{Time: at(5), Node: "cp-2", Component: events.TalosInstall, Version: talosTo},
		{Time: at(9.999), Node: "cp-2", Component: events.Kubelet, Version: "v1.36.3"},
		{Time: at(10), Node: "cp-2", Component: events.Talos, Version: talosTo},
		{Time: at(10.3), Node: "cp-2", Component: events.APIServer, Version: "v1.36.3"},
	}
	done := nodeTimes{applyStarted: at(4), done: at(13)}

	assert.Equal(t, at(11), verifiedAt(step, evs, done), "Node Ready RL after the boot")

	evs[3].Time = at(10.5) // a kubelet that starts after the boot's event
	assert.Equal(t, at(11.5), verifiedAt(step, evs, done))

	assert.Equal(t, at(13), verifiedAt(step, evs[:3], done), "no boot at the target: when the runner saw it done")
}

func TestPodsStoppingIsTheClustersShareOfAKubeletsGap(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

	saved := benchLatencies.PodTermination
	benchLatencies.PodTermination = 2 * time.Second
	t.Cleanup(func() { benchLatencies.PodTermination = saved })

	batch := group{{Node: "worker-3"}, {Node: "worker-4"}}
	evs := []events.Event{
		{Time: at(1), Node: "worker-1", Component: events.PodStopped, Version: "default/a"}, // the batch before's
		{Time: at(12.5), Node: "worker-4", Component: events.PodStopped, Version: "default/b"},
		{Time: at(20), Node: "worker-3", Component: events.PodStopped, Version: "default/c"}, // after its apply
	}

	assert.Equal(t, 2*time.Second, podsStopping("Kubelets", batch, evs, at(10), at(13)), "a pod of the batch stopped in the gap")
	assert.Zero(t, podsStopping("Kubelets", batch, evs[:1], at(10), at(13)), "none of the batch's pods stopped in it: its drain evicted nothing")
	assert.Zero(t, podsStopping("Kubelets", batch, evs, at(13), at(15)), "the batch's pods stopped outside the gap")
	assert.Zero(t, podsStopping("TalosOS", batch, evs, at(10), at(13)), "a Talos node installs while its pods stop")

	gap := newGap("Kubelets", "[worker-1 worker-2]", batch.String(), at(10), at(13), podsStopping("Kubelets", batch, evs, at(10), at(13)), nil)
	assert.InDelta(t, 1.0, gap.Seconds, 1e-9, "3s from verified to apply, 2s of it the pod's termination")
	assert.InDelta(t, 2.0, gap.Required, 1e-9)
}
