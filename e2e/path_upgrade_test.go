//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// The path of the upgrade-cluster tests: the cluster starts on Talos pathTalos with
// Kubernetes pathKube, and goes to talos114 with kube137 in five hops.
const (
	pathTalos = "v1.12.4"
	pathKube  = "v1.33.4"
)

// pathHop is a hop of the path as the operation's spec carries it.
type pathHop struct{ upgrade, to, source string }

// pathHops is the path from pathTalos/pathKube to talos114/kube137 with --via v1.35.4
// and the other intermediate Kubernetes releases found on a mirror holding v1.34.5 and
// v1.36.3 as their minors' newest patches (TestPathPlan's path).
var pathHops = []pathHop{
	{api.UpgradeTalos, talos114, api.SourceTarget},
	{api.UpgradeKubernetes, "v1.34.5", api.SourceRegistry},
	{api.UpgradeKubernetes, "v1.35.4", api.SourceVia},
	{api.UpgradeKubernetes, "v1.36.3", api.SourceRegistry},
	{api.UpgradeKubernetes, kube137, api.SourceTarget},
}

// allVia is the same path with every intermediate Kubernetes release named by --via:
// no registry is asked.
func allVia() []pathHop {
	out := slices.Clone(pathHops)
	for i := 1; i < len(out)-1; i++ {
		out[i].source = api.SourceVia
	}

	return out
}

// ichorTrusting is c.ichor with the operator's machine trusting the cluster's mirror
// (its CA in SSL_CERT_FILE), as `plan cluster` needs to list the mirror's tags.
func (c *Cluster) ichorTrusting(t *testing.T, timeout time.Duration, args ...string) pluginResult {
	t.Helper()

	trust := []string{"SSL_CERT_FILE=" + filepath.Join(c.Dir, cluster.MirrorCAFile)}

	r, err := c.runIchor(env(t, "ICHOR_PLUGIN"), cleanEnv(t, trust), timeout, args...)
	if err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}

	t.Logf("kubectl-ichor %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)

	return r
}

// requirePathLaunched checks what `upgrade cluster --detach` printed and the
// operation it launched: one operation of the whole path.
func requirePathLaunched(t *testing.T, c *Cluster, r pluginResult, want []pathHop, pause bool) *api.Operation {
	t.Helper()

	r.requireExit(t, 0)
	require.Contains(t, r.stdout, fmt.Sprintf("Path, %d hops in this order, each legal when it starts:", len(want)), "the path first")
	require.Contains(t, r.stdout, "1/5  talos       "+pathTalos+" -> "+talos114+"  (target)")
	require.Contains(t, r.stdout, "5/5  kubernetes  v1.36.3 -> "+kube137+"  (target)")
	require.Contains(t, r.stdout, "Launched operation ")

	op := c.operation(t)
	require.Equal(t, api.UpgradeCluster, op.Spec.Upgrade)
	require.Equal(t, pause, op.Spec.PauseBetweenHops)
	requireHopSpecs(t, op, want)

	return op
}

func requireHopSpecs(t *testing.T, op *api.Operation, want []pathHop) {
	t.Helper()

	got := make([]pathHop, 0, len(op.Spec.Hops))
	for _, h := range op.Spec.Hops {
		got = append(got, pathHop{h.Upgrade, h.To, h.Source})
	}

	require.Equal(t, want, got, "the operation's hops")
}

// TestPathUpgrade takes a 3+2 cluster on Talos v1.12.4 with Kubernetes v1.33.4, its
// images on the cluster's mirror, to Talos v1.14.1 and Kubernetes v1.37.2 in one
// `upgrade cluster` operation run by the Job (five hops: Talos, then Kubernetes one
// minor at a time). The runner is killed once, with no grace, while a later hop runs;
// the operator resumes and the path ends: every hop done once and in order, and at no
// point of the simulator's record a node whose Talos does not support the Kubernetes it
// runs.
func TestPathUpgrade(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--talos", pathTalos, "--kubernetes", pathKube,
		"--mirror", "v1.34.3,v1.34.5,v1.35.4,v1.35.6,v1.36.1,v1.36.3,v1.37.2")
	require.NotEmpty(t, c.Info.Mirror)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	start := time.Now()
	r := c.ichorTrusting(t, 3*time.Minute, "upgrade", "cluster", "--talos", talos114, "--kubernetes", kube137, "--via", "v1.35.4", "--yes", "--detach")
	launched := requirePathLaunched(t, c, r, pathHops, false)

	// A later hop than the first under way: kill its runner once.
	const killFrom = 3

	eventually(t, 15*time.Minute, fmt.Sprintf("hop %d under way", killFrom), func(context.Context) error {
		op := c.operation(t)
		switch {
		case op.Status.Phase == api.PhaseSucceeded || op.Status.Phase == api.PhasePaused || op.Status.Phase == api.PhaseAborted:
			t.Fatalf("operation %s %s at hop %d before hop %d: %s", op.Spec.ID, op.Status.Phase, op.Status.Hop, killFrom, op.Status.Reason)
		case op.Status.Hop < killFrom:
			return fmt.Errorf("hop %d (%s %s)", op.Status.Hop, op.Status.Stage, op.Status.Phase)
		}

		return nil
	})

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed))
	zero := int64(0)

	// The runner may move between its lock and the kill (its node drained): then the
	// kill waits for the next one.
	var (
		holder string
		op     *api.Operation
	)

	for {
		holder = waitForRunner(t, c)
		require.NotEmpty(t, holder, "the path ended before the kill")

		time.Sleep(time.Duration(200+rng.IntN(2800)) * time.Millisecond)

		op = c.operation(t)
		require.Equal(t, api.PhaseRunning, op.Status.Phase, "still running at the kill (seed %d)", seed)

		err := c.Client.CoreV1().Pods(jobNamespace).Delete(ctx, holder, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if apierrors.IsNotFound(err) {
			continue
		}

		require.NoError(t, err, "kill the runner %s", holder)

		break
	}

	killedAt := time.Now()
	t.Logf("killed the runner %s at hop %d/%d, stage %s (seed %d)", holder, op.Status.Hop, len(pathHops), op.Status.Stage, seed)

	eventually(t, time.Minute, "the killed runner gone", func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, holder, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)) {
			return nil
		}

		return fmt.Errorf("pod %s still there (%v)", holder, err)
	})

	// The operator resumes; when the Job was quicker with a new pod, there is nothing to.
	if r := c.ichor(t, 3*time.Minute, "resume", "--detach"); r.code != 0 {
		r.requireOneLineError(t, "nothing to resume")
	}

	r = c.ichor(t, 20*time.Minute, "status", "--watch")
	r.requireExit(t, 0)
	t.Logf("upgraded 3+2 from Talos %s and Kubernetes %s to Talos %s and Kubernetes %s in one operation in %s",
		pathTalos, pathKube, talos114, kube137, time.Since(start).Round(time.Millisecond))

	final := c.operation(t)
	assert.Equal(t, launched.Spec.ID, final.Spec.ID, "one operation")
	assert.GreaterOrEqual(t, final.Status.Runs, 2, "the killed runner had a successor")

	var after []api.RunnerRecord
	for _, run := range final.Status.Runners {
		if run.Pod != holder && run.Started.After(killedAt) {
			after = append(after, run)
		}
	}

	assert.NotEmpty(t, after, "a runner took over after the kill: %+v", final.Status.Runners)

	requirePathDone(t, c, tc, before, final, pathHops)
}

// TestPathUpgradePauseBetweenHops runs the same path with --pause-between-hops and every
// intermediate release named by --via (no mirror, no registry asked): the operation
// pauses once each hop but the last is done, saying so, and goes on with each resume.
func TestPathUpgradePauseBetweenHops(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--talos", pathTalos, "--kubernetes", pathKube)
	addWorkload(t, c, 2)

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)
	want := allVia()

	r := c.ichor(t, 3*time.Minute, "upgrade", "cluster", "--talos", talos114, "--kubernetes", kube137,
		"--via", "v1.34.5,v1.35.4,v1.36.3", "--pause-between-hops", "--yes", "--detach")
	launched := requirePathLaunched(t, c, r, want, true)

	resumes := 0

	for {
		r := c.ichor(t, 15*time.Minute, "status", "--watch")
		if r.code == 0 {
			break
		}

		r.requireExit(t, job.ExitPaused)
		require.Less(t, resumes, len(want)-1, "a pause after the last hop")

		op := c.operation(t)
		done := resumes + 1
		hop := want[done-1]

		require.Equal(t, api.PhasePaused, op.Status.Phase)
		assert.Equal(t, launched.Spec.ID, op.Spec.ID, "one operation")
		// Between hops status.hop is the hop done; NextHop, which the runner starts
		// from, is the next.
		assert.Equal(t, done, op.Status.Hop, "the hop done")
		assert.Equal(t, done+1, op.Status.NextHop(), "a resume runs the next hop")
		assert.Contains(t, op.Status.Reason, fmt.Sprintf("hop %d/%d (%s %s) is done", done, len(want), hop.upgrade, hop.to), "the reason names the hop done")
		assert.Contains(t, op.Status.Reason, fmt.Sprintf("hop %d/%d (%s %s) is next", done+1, len(want), want[done].upgrade, want[done].to))
		assert.Empty(t, op.Status.PausedNode, "a pause between hops is no node's")
		require.Len(t, op.Status.Hops, done, "the hops started so far")
		assert.NotNil(t, op.Status.Hops[done-1].Done, "hop %d done", done)
		requireNothingCordoned(t, c)

		r = c.ichor(t, time.Minute, "status")
		r.requireExit(t, 0)
		assert.Contains(t, r.stdout, fmt.Sprintf("Hop %d/%d %s %s done; next: hop %d/%d %s %s",
			done, len(want), hop.upgrade, hop.to, done+1, len(want), want[done].upgrade, want[done].to))

		t.Logf("paused after hop %d/%d (%s %s): %s", done, len(want), hop.upgrade, hop.to, op.Status.Reason)

		r = c.ichor(t, 3*time.Minute, "resume", "--detach")
		r.requireExit(t, 0)
		require.Contains(t, r.stdout, "Resumed operation "+op.Spec.ID)

		resumes++
	}

	assert.Equal(t, len(want)-1, resumes, "one pause between each two hops")

	final := c.operation(t)
	assert.Equal(t, launched.Spec.ID, final.Spec.ID, "one operation")
	assert.Equal(t, resumes+1, final.Status.Attempt, "a Job per resume")

	requirePathDone(t, c, tc, before, final, want)
}

// requirePathDone checks a cluster after a path to talos114 and kube137 that op ran:
// op Succeeded with every hop of want done once, in order; every node on the targets,
// its config its old one but for the Kubernetes image tags; nothing cordoned, the lock
// released; and the simulator's record of what ran: the Kubernetes invariant and the
// Talos pairing held at every event, and each hop reached its target between its start
// and its end.
func requirePathDone(t *testing.T, c *Cluster, tc *countingTalos, before map[string]config.Provider, op *api.Operation, want []pathHop) {
	t.Helper()

	require.Equal(t, api.PhaseSucceeded, op.Status.Phase, "%s: %s", op.Status.Phase, op.Status.Reason)
	requireHopSpecs(t, op, want)
	assert.Equal(t, len(want), op.Status.Hop, "the last hop")

	require.Len(t, op.Status.Hops, len(want), "every hop started once")

	for i, h := range op.Status.Hops {
		assert.Equal(t, i+1, h.Number, "hop %d", i+1)
		assert.Equal(t, want[i].upgrade, h.Upgrade, "hop %d", i+1)
		assert.Equal(t, want[i].to, h.To, "hop %d", i+1)
		require.False(t, h.Started.IsZero(), "hop %d started", i+1)
		require.NotNil(t, h.Done, "hop %d done", i+1)
		assert.False(t, h.Done.Before(&h.Started), "hop %d done after it started", i+1)

		if i > 0 {
			assert.False(t, h.Started.Before(op.Status.Hops[i-1].Done), "hop %d started after hop %d was done", i+1, i)
		}
	}

	requireTalosAt(t, c, tc, talos114)
	requireUpgraded(t, c, tc, before, kube137)
	requireNothingCordoned(t, c)
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")

	evs := c.Events(t)
	assert.Empty(t, invariantBreaks(evs), "no component newer than an apiserver")
	assert.Len(t, talosStarts(evs, talos114), len(c.Info.Machines), "one boot into %s per node: the Talos hop ran once", talos114)

	breaks, last := unsupportedPairings(evs)
	assert.Empty(t, breaks, "every node's Talos supports the Kubernetes it runs, at every event")

	for _, m := range c.Info.Machines {
		assert.Equal(t, talos114, last[m.Name].talos, "%s: the record's last Talos", m.Name)
		assert.NotEmpty(t, last[m.Name].kube, "%s: the record has its components", m.Name)

		for comp, v := range last[m.Name].kube {
			assert.Equal(t, kube137, v, "%s %s: the record's last version", m.Name, comp)
		}
	}

	requireHopsInRecord(t, evs, op, c.Info.Machines)
}

// nodeRun is what a node runs by the simulator's record: the Talos it last booted and
// the version each Kubernetes component last started at.
type nodeRun struct {
	talos string
	kube  map[string]string
}

// replay returns what every node runs after evs.
func replay(evs []events.Event) map[string]*nodeRun {
	out := map[string]*nodeRun{}

	for _, e := range evs {
		apply(out, e)
	}

	return out
}

func apply(state map[string]*nodeRun, e events.Event) {
	if e.Component == events.TalosInstall || e.Component == events.Cordon {
		return
	}

	n := state[e.Node]
	if n == nil {
		n = &nodeRun{kube: map[string]string{}}
		state[e.Node] = n
	}

	if e.Component == events.Talos {
		n.talos = e.Version
	} else {
		n.kube[e.Component] = e.Version
	}
}

// unsupportedPairings replays evs and returns each point at which a node ran a
// Kubernetes component at a version its Talos (the version it last booted) does not
// support, by compat.Supports, and what every node runs at the end. Only the node of
// an event changes with it, so checking that node at each event checks every node at
// every point. A node's components before its first boot is recorded are checked at
// that boot.
func unsupportedPairings(evs []events.Event) ([]string, map[string]nodeRun) {
	state := map[string]*nodeRun{}

	var broken []string

	for i, e := range evs {
		apply(state, e)

		n := state[e.Node]
		if n == nil || n.talos == "" {
			continue
		}

		talos, err := compat.ParseVersion(n.talos)
		if err != nil {
			broken = append(broken, fmt.Sprintf("event %d (%s %s %s): Talos %s unreadable: %v", i, e.Node, e.Component, e.Version, n.talos, err))

			continue
		}

		for _, comp := range slices.Sorted(maps.Keys(n.kube)) {
			k, err := compat.ParseVersion(n.kube[comp])
			if err == nil {
				err = compat.Supports(talos, k)
			}

			if err != nil {
				broken = append(broken, fmt.Sprintf("event %d (%s %s %s): %s %s on Talos %s: %v",
					i, e.Node, e.Component, e.Version, comp, n.kube[comp], n.talos, err))
			}
		}
	}

	last := map[string]nodeRun{}
	for name, n := range state {
		last[name] = *n
	}

	return broken, last
}

// requireHopsInRecord checks each hop of op against the simulator's record: when it
// started, no node ran its target yet (a Talos hop: booted it; a Kubernetes hop: any
// component at it); by the time it was done, every node did (every component).
func requireHopsInRecord(t *testing.T, evs []events.Event, op *api.Operation, machines []cluster.MachineInfo) {
	t.Helper()

	until := func(at time.Time) map[string]*nodeRun {
		i := slices.IndexFunc(evs, func(e events.Event) bool { return e.Time.After(at) })
		if i < 0 {
			i = len(evs)
		}

		return replay(evs[:i])
	}

	at := func(n *nodeRun, upgrade, to string) (all, some bool) {
		if n == nil {
			return false, false
		}

		if upgrade == api.UpgradeTalos {
			return n.talos == to, n.talos == to
		}

		all = len(n.kube) > 0
		for _, v := range n.kube {
			all = all && v == to
			some = some || v == to
		}

		return all, some
	}

	for _, h := range op.Status.Hops {
		if h.Done == nil {
			continue // requirePathDone said so
		}

		started, done := until(h.Started.Time), until(h.Done.Time)

		for _, m := range machines {
			_, early := at(started[m.Name], h.Upgrade, h.To)
			assert.False(t, early, "hop %d (%s %s): %s ran it before the hop started at %s", h.Number, h.Upgrade, h.To, m.Name, h.Started.Format(time.RFC3339Nano))

			reached, _ := at(done[m.Name], h.Upgrade, h.To)
			assert.True(t, reached, "hop %d (%s %s): %s not on it when the hop was done at %s: %+v",
				h.Number, h.Upgrade, h.To, m.Name, h.Done.Format(time.RFC3339Nano), done[m.Name])
		}
	}
}

// TestPathPrePullRefuses: an image of a later hop that the nodes' mirror does not serve
// stops the path before its first change: the operation pauses naming that hop and the
// image, no node's machine config or Talos moved, nothing is cordoned; abort says no
// hop was done.
func TestPathPrePullRefuses(t *testing.T) {
	t.Parallel()

	faultsFile := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faultsFile, nil, 0o644))

	c := startJobCluster(t, "--workers", "1", "--talos", pathTalos, "--kubernetes", pathKube,
		"--faults", faultsFile, "--mirror", "v1.34.5,v1.35.4,v1.36.3,v1.37.2")
	mirror := c.Info.Mirror
	require.NotEmpty(t, mirror)

	// The mirror stops serving kube-proxy v1.36.3, hop 4's.
	missing := mirror + "/kube-proxy:v1.36.3"
	require.NoError(t, os.WriteFile(faultsFile, []byte("unpublished: ["+missing+"]\n"), 0o644))

	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	r := c.ichorTrusting(t, 3*time.Minute, "upgrade", "cluster", "--talos", talos114, "--kubernetes", kube137,
		"--via", "v1.34.5,v1.35.4,v1.36.3", "--yes", "--detach")
	r.requireExit(t, 0)

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	require.Equal(t, 3, r.code, "paused: %s", r.stdout)

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	assert.Contains(t, op.Status.Reason, "before the path's first change, hop 4/5 (kubernetes v1.36.3): pre-pull: ")
	assert.Contains(t, op.Status.Reason, missing)
	assert.Contains(t, op.Status.Reason, "nothing was changed")
	assert.Empty(t, op.Status.Hops, "no hop started")

	after := machineConfigs(t, c, tc)
	for node, cfg := range before {
		assert.Equal(t, render.Images(cfg), render.Images(after[node]), "node %s's images unchanged", node)
	}

	requireTalosAt(t, c, tc, pathTalos)
	requireNothingCordoned(t, c)

	r = c.ichor(t, time.Minute, "abort")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "no hop of the path's 5 was done")
}
