//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// TestJobPreExistingSkew gives a worker a kubelet newer than the apiservers before the
// upgrade: plan reports it as a warning of its invariant check (not a refusal), and the
// upgrade through the Job, which keeps it from growing and moves the apiservers first,
// runs to the end.
func TestJobPreExistingSkew(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()

	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	patchMachineConfig(t, tc, c.Machine(t, "worker-1").IP, func(cfg *v1alpha1.Config) {
		cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.36.3"
	})

	eventually(t, 2*time.Minute, "worker-1's kubelet at v1.36.3", func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if v := n.Status.NodeInfo.KubeletVersion; v != "v1.36.3" || !nodeReady(n) {
			return fmt.Errorf("kubelet %s, ready %t", v, nodeReady(n))
		}

		return nil
	})

	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)

	check := tableChecks(r.stdout)["invariant"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "skew already there: kubelet v1.36.3 on worker-1 (Node worker-1) is newer than kube-apiserver v1.35.4")

	tcount := openTalos(t, c)
	before := machineConfigs(t, c, tcount)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)

	// The only skew ever seen is worker-1's, there before the upgrade.
	for _, broken := range invariantBreaks(c.Events(t)) {
		assert.True(t, strings.Contains(broken, "kubelet v1.36.3 on worker-1 newer than apiserver v1.35.4"), broken)
	}
}

// TestJobApiserverVersionUnknown gives cp-2's kube-apiserver an image whose tag says
// no version (a suffixed tag: Talos refuses a digest-only one in the machine config)
// while an upgrade through the Job is paused, cp-1 and cp-2 already on the target's
// apiserver and cp-3 not. plan refuses it as its invariant check, and resume stops the
// APIServers stage on cp-2 with what to do, changing nothing; once cp-2 names a
// vMAJOR.MINOR.PATCH tag again, resume finishes.
func TestJobApiserverVersionUnknown(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	c := startJobCluster(t, "--faults", faults)
	ctx := context.Background()

	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tc.Close() })

	tcount := openTalos(t, c)
	before := machineConfigs(t, c, tcount)

	// cp-3's apply blocks: the upgrade pauses there, with cp-1 and cp-2 done.
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  cp-3:\n    applyBlocks: true\n"), 0o644))

	r := c.ichor(t, 5*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--apply-timeout", "5s")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "paused: APIServers cp-3: ")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	setAPIServerImage := func(image string) {
		t.Helper()
		patchMachineConfig(t, tc, c.Machine(t, "cp-2").IP, func(cfg *v1alpha1.Config) {
			cfg.ClusterConfig.APIServerConfig.ContainerImage = image
		})
		waitMirrorPod(t, c, "kube-apiserver-cp-2", image)
	}

	image := "registry.k8s.io/kube-apiserver:v1.36.3-custom"
	setAPIServerImage(image)

	r = c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 2)

	check := tableChecks(r.stdout)["invariant"]
	require.Equal(t, api.ResultRefused, check.result)
	require.Contains(t, check.detail, fmt.Sprintf("apiserver version unknown: kube-apiserver on cp-2: image %q has no vMAJOR.MINOR.PATCH tag", image))
	require.Contains(t, check.detail, "give kube-apiserver on cp-2 an image tagged vMAJOR.MINOR.PATCH")

	r = c.ichor(t, 5*time.Minute, "resume")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "paused: APIServers cp-2: ")

	op := c.operation(t)
	assert.Equal(t, "cp-2", op.Status.PausedNode)
	assert.Contains(t, op.Status.Reason, fmt.Sprintf("apiserver version unknown: kube-apiserver on cp-2: image %q", image))
	assert.Contains(t, op.Status.Action, "give kube-apiserver on cp-2 an image tagged vMAJOR.MINOR.PATCH (cluster.apiServer.image in its machine config")

	// Stopped, not skipped: nothing moved.
	waitMirrorPod(t, c, "kube-apiserver-cp-2", image)
	waitMirrorPod(t, c, "kube-apiserver-cp-3", "registry.k8s.io/kube-apiserver:v1.35.4")

	// What the pause said to do, done: resume finishes.
	setAPIServerImage("registry.k8s.io/kube-apiserver:v1.36.3")

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	assert.Equal(t, 3, c.operation(t).Status.Attempt)

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// TestJobHoldRemovedMidUpgrade launches an upgrade with cp-3 and worker-1 held (plan
// warns where cp-3 stops it). cp-3's apiserver stays behind, so the
// ControlPlaneComponents stage stops before cp-1's controller-manager passes it,
// saying to remove the hold; once removed, resume takes cp-3 from the APIServers
// stage, one stage's worth per apply. worker-1's hold goes while that run is in the
// Kubelets stage: the same run upgrades it. The simulator's events show the
// invariant held at every start and cp-3's components moving in the stages' order.
func TestJobHoldRemovedMidUpgrade(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()

	tcount := openTalos(t, c)
	before := machineConfigs(t, c, tcount)

	require.NoError(t, setHold(ctx, c, "cp-3", "RMA"))
	require.NoError(t, setHold(ctx, c, "worker-1", "firmware"))

	// plan says where the held control plane stops the upgrade.
	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)

	check := tableChecks(r.stdout)["invariant"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "held control plane cp-3 keeps its kube-apiserver behind v1.36.3: the upgrade stops before the ControlPlaneComponents stage")

	r = c.ichor(t, 5*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, job.ExitPaused)
	r.requireOneLineError(t, "paused: ControlPlaneComponents cp-1: ")

	op := c.operation(t)
	assert.Contains(t, op.Status.Reason, "kube-apiserver v1.35.4 on cp-3")
	assert.Contains(t, op.Status.Action, "remove the hold")

	require.NoError(t, setHold(ctx, c, "cp-3", ""))

	// worker-1's hold goes once the resumed run is in the Kubelets stage.
	released := make(chan error, 1)

	go func() {
		released <- releaseWhen(ctx, c, "worker-1", "the Kubelets stage", func(op *api.Operation) bool {
			return op.Status.Stage == "Kubelets"
		})
	}()

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.NoError(t, <-released)

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)

	evs := c.Events(t)
	requireCaughtUp(t, c, evs, "cp-3")

	_, ok := firstAt(evs, "v1.36.3")[events.Kubelet+" worker-1"]
	assert.True(t, ok, "worker-1's kubelet at v1.36.3")
}

// TestJobHoldRemovedMidRun launches an upgrade with cp-3 held and removes the hold
// once the APIServers stage has passed it over: the next stage takes cp-3 first,
// through the APIServers stage it missed, before any controller-manager moves, and
// the run goes on to the end without a pause.
func TestJobHoldRemovedMidRun(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()

	tcount := openTalos(t, c)
	before := machineConfigs(t, c, tcount)

	require.NoError(t, setHold(ctx, c, "cp-3", "RMA"))

	released := make(chan error, 1)

	go func() {
		released <- releaseWhen(ctx, c, "cp-3", "the APIServers stage with cp-3 held", func(op *api.Operation) bool {
			n := op.Status.Node("cp-3")

			return op.Status.Stage == "APIServers" && n != nil && n.Stage == "APIServers" && n.Phase == string(engine.PhaseHeld)
		})
	}()

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.NoError(t, <-released)
	assert.Equal(t, 1, c.operation(t).Status.Attempt, "no pause")

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)
	requireCaughtUp(t, c, c.Events(t), "cp-3")
}

// TestJobControlPlaneJoinsMidUpgrade starts a 4+2 cluster with cp-4 powered off, as
// a control plane an operator adds later from its saved machine config (the cluster's
// original versions), and switches it on once the upgrade through the Job is in the
// ControlPlaneComponents stage. cp-4 boots and joins at v1.35.4: its old apiserver is
// skew the join brings, not an apply. The next stage takes cp-4 first, from the
// APIServers stage, one stage's worth per apply, and nothing else moves until cp-4's
// apiserver is on the target; the run ends with every node on it.
func TestJobControlPlaneJoinsMidUpgrade(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  cp-4:\n    poweredOff: true\n"), 0o644))

	c := startJobCluster(t, "--control-planes", "4", "--faults", faults)
	ctx := context.Background()

	// cp-4 is off: no Node, no etcd member, its Talos API unreachable.
	_, err := c.Client.CoreV1().Nodes().Get(ctx, "cp-4", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "no Node cp-4 while it is off: %v", err)

	tcount := openTalos(t, c)
	before := map[string]config.Provider{}

	for _, m := range c.Info.Machines {
		if m.Name == "cp-4" {
			continue
		}

		cfg, err := tcount.MachineConfig(ctx, m.IP)
		require.NoError(t, err, m.Name)

		before[m.Name] = cfg
	}

	memberNames := func() []string {
		t.Helper()

		members, err := tcount.EtcdMembers(ctx, c.Machine(t, "cp-1").IP)
		require.NoError(t, err)

		var names []string
		for _, m := range members {
			names = append(names, m.Hostname)
		}

		return names
	}

	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3"}, memberNames(), "cp-4 is no etcd member while off")

	joined := make(chan error, 1)

	go func() {
		joined <- powerOnWhen(ctx, c, faults, "the ControlPlaneComponents stage", func(op *api.Operation) bool {
			return op.Status.Stage == "ControlPlaneComponents"
		})
	}()

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.NoError(t, <-joined)
	assert.Equal(t, 1, c.operation(t).Status.Attempt, "no pause")

	requireUpgraded(t, c, tcount, before, "v1.36.3")
	requireNothingCordoned(t, c)

	// cp-4's own config is on the target too, only its image tags changed.
	cfg, err := tcount.MachineConfig(ctx, c.Machine(t, "cp-4").IP)
	require.NoError(t, err)

	for comp, image := range render.Images(cfg) {
		assert.Equal(t, "v1.36.3", render.TagOf(image), "cp-4 %s", comp)
	}

	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3", "cp-4"}, memberNames(), "cp-4 an etcd member once it joined")

	evs := c.Events(t)
	at := firstAt(evs, "v1.36.3")
	joinedAt, ok := firstAt(evs, "v1.35.4")[events.APIServer+" cp-4"]
	require.True(t, ok, "cp-4's apiserver started at its config's v1.35.4")

	caughtUp, ok := at[events.APIServer+" cp-4"]
	require.True(t, ok, "cp-4's apiserver at v1.36.3")

	// From the join to cp-4's apiserver on the target, nothing but cp-4's own start
	// moved by an apply made after the join (no apply made the skew worse; a static
	// pod an apply just before the join restarts may come up after it); after, the
	// invariant holds. The stage applies one node at a time, and an apply decided
	// before cp-4 could be seen may land just after its boot (seen in CI: 19 ms
	// after): that one apply in flight is the join's, not the stage's; a second
	// apply to another node before cp-4 caught up is the stage going on blind.
	applied := configApplied(t, c)
	require.GreaterOrEqual(t, len(applied["cp-1"]), 4, "the simulator's log says when cp-1 took each stage's config")

	boot := evs[joinedAt].Time

	for _, e := range evs {
		if e.Node == "cp-4" && e.Component == events.Talos && !e.Time.After(evs[joinedAt].Time) {
			boot = e.Time
		}
	}

	inFlight := inFlightApply(applied, "cp-4", boot)

	for i := joinedAt + 1; i < caughtUp; i++ {
		e := evs[i]
		if e.Node == "cp-4" || e.Component == events.Talos || e.Component == events.TalosInstall || e.Component == events.Cordon {
			continue
		}

		var last time.Time

		for _, at := range applied[e.Node] {
			if at.Before(e.Time) {
				last = at
			}
		}

		if !last.Before(boot) && !last.Equal(inFlight) {
			assert.Fail(t, "a component moved while cp-4's apiserver was behind", "event %d: %s %s %s (its config applied %s, cp-4 booted %s)",
				i, e.Node, e.Component, e.Version, last.Format(time.RFC3339Nano), boot.Format(time.RFC3339Nano))
		}
	}

	for _, broken := range invariantBreaks(evs) {
		var i int

		_, err := fmt.Sscanf(broken, "event %d", &i)
		require.NoError(t, err, broken)
		assert.True(t, i >= joinedAt && i < caughtUp, "the only skew is the one cp-4's join brought, until its apiserver caught up: %s", broken)
		assert.Contains(t, broken, "newer than apiserver v1.35.4", broken)
	}

	for _, comp := range []string{events.ControllerManager, events.Scheduler, events.Kubelet} {
		i, ok := at[comp+" cp-4"]
		require.True(t, ok, "cp-4's %s at v1.36.3", comp)
		assert.Less(t, caughtUp, i, "cp-4's apiserver on the target before its %s", comp)
	}

	assert.Less(t, max(at[events.ControllerManager+" cp-4"], at[events.Scheduler+" cp-4"]), at[events.Kubelet+" cp-4"])

	requireStageTimeline(t, c, "cp-4")
}

// powerOnWhen clears every fault (cp-4's poweredOff) once the operation runs and
// cond holds, and checks that it still did after. It runs beside the test, so it
// returns what went wrong rather than failing the test.
func powerOnWhen(ctx context.Context, c *Cluster, faults, what string, cond func(*api.Operation) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()

	for {
		op, err := c.control().Get(ctx)
		if err == nil && op != nil && op.Status.Phase == api.PhaseRunning && cond(op) {
			if err := os.WriteFile(faults, []byte("nodes: {}\n"), 0o644); err != nil {
				return err
			}

			if op, err = c.control().Get(ctx); err != nil {
				return err
			}

			if op.Status.Phase != api.PhaseRunning || !cond(op) {
				return fmt.Errorf("powered on once the operation was %s in %s, not in %s", op.Status.Phase, op.Status.Stage, what)
			}

			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("the operation never reached %s", what)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// requireCaughtUp checks that node, released from its hold mid-upgrade, caught up one
// stage's worth per apply: the invariant held at every event of the simulator; its
// apiserver reached the target before any controller-manager or scheduler did, then its
// controller-manager and scheduler, then its kubelet; and the operation's timeline of
// the node shows an apply for each of the four stages, each done before the next began.
func requireCaughtUp(t *testing.T, c *Cluster, evs []events.Event, node string) {
	t.Helper()

	require.Empty(t, invariantBreaks(evs), "the invariant held at every event")

	at := firstAt(evs, "v1.36.3")
	of := func(component, node string) int {
		i, ok := at[component+" "+node]
		require.True(t, ok, "%s never started at v1.36.3 on %s", component, node)

		return i
	}

	for _, cp := range []string{"cp-1", "cp-2", "cp-3"} {
		assert.Less(t, of(events.APIServer, node), of(events.ControllerManager, cp), "%s's apiserver before %s's controller-manager", node, cp)
		assert.Less(t, of(events.APIServer, node), of(events.Scheduler, cp), "%s's apiserver before %s's scheduler", node, cp)
	}

	assert.Less(t, max(of(events.ControllerManager, node), of(events.Scheduler, node)), of(events.Kubelet, node))

	requireStageTimeline(t, c, node)
}

// requireStageTimeline checks that the operation's timeline of node shows an apply
// for each of the four stages, in their order, each done before the next began.
func requireStageTimeline(t *testing.T, c *Cluster, node string) {
	t.Helper()

	status := c.operation(t).Status.Node(node)
	require.NotNil(t, status, "%s in the operation's status", node)

	var stageNames []string

	for i, st := range status.Timeline {
		stageNames = append(stageNames, st.Stage)

		require.NotNil(t, st.ApplyStarted, "%s: an apply in stage %s", node, st.Stage)
		require.NotNil(t, st.Done, "%s: done in stage %s", node, st.Stage)

		if i > 0 {
			assert.False(t, st.ApplyStarted.Before(status.Timeline[i-1].Done), "%s: stage %s applied before stage %s was done", node, st.Stage, status.Timeline[i-1].Stage)
		}
	}

	assert.Equal(t, []string{"APIServers", "ControlPlaneComponents", "KubeProxy", "Kubelets"}, stageNames, "%s: one apply per stage, in order", node)
}

// setHold sets (reason not empty) or removes the hold annotation on node.
func setHold(ctx context.Context, c *Cluster, node, reason string) error {
	value := "null"
	if reason != "" {
		value = fmt.Sprintf("%q", reason)
	}

	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, discovery.HoldAnnotation, value)
	_, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})

	return err
}

// releaseWhen removes node's hold once the operation runs and cond holds, and checks
// that it still did after. It runs beside the test, so it returns what went wrong
// rather than failing the test.
func releaseWhen(ctx context.Context, c *Cluster, node, what string, cond func(*api.Operation) bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()

	for {
		op, err := c.control().Get(ctx)
		if err == nil && op != nil && op.Status.Phase == api.PhaseRunning && cond(op) {
			if err := setHold(ctx, c, node, ""); err != nil {
				return err
			}

			if op, err = c.control().Get(ctx); err != nil {
				return err
			}

			if op.Status.Phase != api.PhaseRunning || !cond(op) {
				return fmt.Errorf("%s released once the operation was %s in %s, not in %s", node, op.Status.Phase, op.Status.Stage, what)
			}

			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("the operation never reached %s", what)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// firstAt maps "component node" to the index of its first start at version.
func firstAt(evs []events.Event, version string) map[string]int {
	first := map[string]int{}

	for i, e := range evs {
		key := e.Component + " " + e.Node
		if _, seen := first[key]; !seen && e.Version == version {
			first[key] = i
		}
	}

	return first
}

// inFlightApply is the first config apply, on a node other than joiner, at or after
// the joiner's boot: the one apply a stage that goes one node at a time can have
// had in flight when the joiner came up (zero when there is none).
func inFlightApply(applied map[string][]time.Time, joiner string, boot time.Time) time.Time {
	var first time.Time

	for node, times := range applied {
		if node == joiner {
			continue
		}

		for _, at := range times {
			if !at.Before(boot) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
	}

	return first
}

// configApplied reads, from the simulator's log, when each machine took a config
// ("config applied"), by node, oldest first.
func configApplied(t *testing.T, c *Cluster) map[string][]time.Time {
	t.Helper()

	b, err := os.ReadFile(filepath.Join(c.Dir, cluster.LogDir, "ichor-sim.log"))
	require.NoError(t, err)

	out := map[string][]time.Time{}

	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `msg="config applied"`) {
			continue
		}

		var at time.Time
		var node string

		for _, f := range strings.Fields(line) {
			switch {
			case strings.HasPrefix(f, "time="):
				at, err = time.Parse(time.RFC3339Nano, strings.TrimPrefix(f, "time="))
				require.NoError(t, err, line)
			case strings.HasPrefix(f, "node="):
				node = strings.TrimPrefix(f, "node=")
			}
		}

		out[node] = append(out[node], at)
	}

	return out
}
