//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

const (
	talosFrom = "v1.12.4"
	talosTo   = "v1.13.9"
	// simReboot is how long a simulated machine is down for a reboot (the
	// simulator's default latency).
	simReboot = 3 * time.Second
)

// memoMap is the engine's Memo in memory, as the runner keeps it in the
// state ConfigMap.
type memoMap struct {
	mu sync.Mutex
	m  map[string]string
}

func (m *memoMap) Get(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()

	v, ok := m.m[key]

	return v, ok
}

func (m *memoMap) Set(ctx context.Context, key, value string) error {
	if err := ctx.Err(); err != nil {
		return err
	}

	m.mu.Lock()
	defer m.mu.Unlock()

	if m.m == nil {
		m.m = map[string]string{}
	}

	m.m[key] = value

	return nil
}

func (m *memoMap) all() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()

	return maps.Clone(m.m)
}

// talosEngineFor returns an Engine for a Talos upgrade of c to target, with
// bounds fit for the simulator. A cluster of fewer than 3 control planes
// accepts the etcd outage of each control plane's reboot
// (--allow-etcd-outage): TestTalosEtcdGateAndRecordon shows the gate.
func talosEngineFor(t *testing.T, c *Cluster, tc *countingTalos, target string, memo *memoMap, progress *lines) *engine.Engine {
	t.Helper()

	controlPlanes := 0

	for _, m := range c.Info.Machines {
		if m.ControlPlane {
			controlPlanes++
		}
	}

	return &engine.Engine{
		Kube:  c.Client,
		Talos: tc,
		Options: engine.Options{
			Kind: engine.KindTalos, Target: target, MaxUnavailable: 1, AllowEtcdOutage: controlPlanes < 3,
			VerifyTimeout: 2 * time.Minute, DrainTimeout: 2 * time.Minute, UpgradeTimeout: 2 * time.Minute, RebootTimeout: 2 * time.Minute,
		},
		Progress: progress,
		Memo:     memo,
		Out:      testWriter{t},
	}
}

// unavailability watches the Nodes and records the most that were at once
// NotReady or unschedulable, and which.
type unavailability struct {
	mu   sync.Mutex
	most []string
}

func watchUnavailable(t *testing.T, c *Cluster) *unavailability {
	t.Helper()

	u := &unavailability{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	nodes, err := kube.StartNodes(ctx, c.Client)
	require.NoError(t, err)
	t.Cleanup(nodes.Stop)

	cache, err := kube.StartCache(ctx, c.Client, nodes)
	require.NoError(t, err)
	t.Cleanup(cache.Stop)

	go func() {
		_ = cache.Wait(ctx, time.Hour, func() (bool, string) {
			var down []string

			for _, m := range c.Info.Machines {
				n, ok := cache.Node(m.Name)
				if ok && (!nodeReady(n) || n.Spec.Unschedulable) {
					down = append(down, m.Name)
				}
			}

			u.mu.Lock()
			if len(down) > len(u.most) {
				u.most = down
			}
			u.mu.Unlock()

			return false, fmt.Sprint(down)
		}, nil)
	}()

	return u
}

func (u *unavailability) max() []string {
	u.mu.Lock()
	defer u.mu.Unlock()

	return slices.Clone(u.most)
}

// talosStarts are the boots into version in events.jsonl, in order.
func talosStarts(evs []events.Event, version string) []events.Event {
	var out []events.Event

	for _, e := range evs {
		if e.Component == events.Talos && e.Version == version {
			out = append(out, e)
		}
	}

	return out
}

func eventNodes(evs []events.Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Node)
	}

	return out
}

// requireTalosAt checks every node of c runs Talos version, by its Talos
// API and by its Node's osImage, Ready, schedulable and without ichor's mark.
func requireTalosAt(t *testing.T, c *Cluster, tc *countingTalos, version string) {
	t.Helper()

	ctx := context.Background()

	for _, m := range c.Info.Machines {
		v, err := tc.Version(ctx, m.IP)
		require.NoError(t, err, m.Name)
		assert.Equal(t, version, v, "%s Talos version", m.Name)

		n, err := c.Client.CoreV1().Nodes().Get(ctx, m.Name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "Talos ("+version+")", n.Status.NodeInfo.OSImage, m.Name)
		assert.True(t, nodeReady(n), "%s Ready", m.Name)
		assert.False(t, n.Spec.Unschedulable, "%s schedulable", m.Name)
		assert.False(t, kube.CordonedByIchor(n), "%s has no cordon mark", m.Name)
	}
}

// requireOneRebootAtATime checks the boots into target in events.jsonl: one
// per node, in order, each at least a reboot's length after the one before
// (two machines down at once would come back within moments of each other).
func requireOneRebootAtATime(t *testing.T, evs []events.Event, order []string) {
	t.Helper()

	starts := talosStarts(evs, talosTo)
	require.Equal(t, order, eventNodes(starts), "one boot into %s per node, in this order", talosTo)

	for i := 1; i < len(starts); i++ {
		gap := starts[i].Time.Sub(starts[i-1].Time)
		assert.GreaterOrEqual(t, gap, simReboot-500*time.Millisecond, "%s came back %s after %s", starts[i].Node, gap, starts[i-1].Node)
	}
}

// TestTalosEngineUpgrade drives the engine directly against a 3+2 cluster
// from Talos v1.12.4 to v1.13.9 (Kubernetes v1.35.4, which both support),
// with a Deployment behind a budget on the workers.
func TestTalosEngineUpgrade(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", talosFrom)
	addWorkload(t, c, 2)

	tc := openTalos(t, c)
	memo := &memoMap{}
	u := watchUnavailable(t, c)

	start := time.Now()
	require.NoError(t, talosEngineFor(t, c, tc, talosTo, memo, &lines{}).Run(context.Background()))
	t.Logf("upgraded Talos on 3+2 from %s to %s in %s", talosFrom, talosTo, time.Since(start).Round(time.Millisecond))

	requireTalosAt(t, c, tc, talosTo)
	requireOneRebootAtATime(t, c.Events(t), allNodes)
	assert.Len(t, u.max(), 1, "one node unavailable at a time: %v", u.max())
	assert.Len(t, memo.all(), 5, "a boot ID recorded per node: %v", memo.all())

	// Kubernetes did not move; the workload survived its drains.
	nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	for _, n := range nodes.Items {
		assert.Equal(t, "v1.35.4", n.Status.NodeInfo.KubeletVersion, n.Name)
	}

	eventually(t, time.Minute, "web pods Ready", func(ctx context.Context) error {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if d.Status.ReadyReplicas != 2 {
			return fmt.Errorf("%d of 2 Ready", d.Status.ReadyReplicas)
		}

		return nil
	})

	// A second run finds every node on the target and reboots nothing.
	require.NoError(t, talosEngineFor(t, c, tc, talosTo, &memoMap{}, &lines{}).Run(context.Background()))
	assert.Len(t, talosStarts(c.Events(t), talosTo), 5)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// TestTalosEngineFaults: an A/B fallback on worker-1 pauses with what
// happened and what to do; resumed once the fault is cleared, the upgrade
// tries worker-1 again, then worker-2 never comes back and the run pauses
// after a short RebootTimeout; once it boots, a resume finishes.
func TestTalosEngineFaults(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	setFaults := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(faults, []byte(doc), 0o644))
	}

	setFaults("nodes:\n  worker-1:\n    abFallback: true\n  worker-2:\n    neverBoots: true\n")

	c := startCluster(t, "--control-planes", "1", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", talosFrom, "--faults", faults)
	tc := openTalos(t, c)
	memo := &memoMap{}
	ctx := context.Background()

	t.Run("an A/B fallback pauses", func(t *testing.T) {
		err := talosEngineFor(t, c, tc, talosTo, memo, &lines{}).Run(ctx)

		var pause *engine.PauseError
		require.ErrorAs(t, err, &pause)
		t.Logf("paused: %v", err)
		assert.Equal(t, "TalosOS", pause.Stage)
		assert.Equal(t, "worker-1", pause.Node)
		assert.Contains(t, pause.Reason, `node "worker-1": A/B fallback: it rebooted (boot ID changed) but runs Talos v1.12.4, not v1.13.9`)
		assert.Contains(t, pause.Reason, "the node stays cordoned")
		assert.Contains(t, pause.Action, "talosctl -n "+c.Machine(t, "worker-1").IP+" dmesg")
		assert.Contains(t, pause.Action, "kubectl ichor resume")
		assert.Contains(t, pause.Action, "kubectl ichor abort")

		v, err := tc.Version(ctx, c.Machine(t, "worker-1").IP)
		require.NoError(t, err)
		assert.Equal(t, talosFrom, v)

		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		assert.True(t, kube.CordonedByIchor(n), "worker-1 stays cordoned for the operator to look")

		assert.Equal(t, []string{"cp-1"}, eventNodes(talosStarts(c.Events(t), talosTo)))
		assert.False(t, hasEvent(c.Events(t), "worker-2", events.Talos, talosTo), "nothing after the fallback")

		// The operator looks at the node before resuming: by then its fallback boot is
		// Ready (a resume at once would find it NotReady, still starting, and refuse).
		eventually(t, 30*time.Second, "worker-1 Ready in its fallback boot", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(n) {
				return fmt.Errorf("worker-1 NotReady: %s", readyMessage(n))
			}
			return nil
		})
	})

	t.Run("a node that never comes back pauses after the bound", func(t *testing.T) {
		setFaults("nodes:\n  worker-2:\n    neverBoots: true\n")

		e := talosEngineFor(t, c, tc, talosTo, memo, &lines{})
		e.Options.RebootTimeout = 15 * time.Second

		start := time.Now()
		err := e.Run(ctx)

		var pause *engine.PauseError
		require.ErrorAs(t, err, &pause)
		t.Logf("paused after %s: %v", time.Since(start).Round(time.Millisecond), err)
		assert.Equal(t, "worker-2", pause.Node)
		assert.Contains(t, pause.Reason, "did not come back on Talos v1.13.9 within 15s of its Upgrade call: rebooting: Talos API unreachable")
		assert.Contains(t, pause.Reason, "the node stays cordoned")
		assert.Contains(t, pause.Action, "talosctl -n "+c.Machine(t, "worker-2").IP+" dmesg")
		assert.Less(t, time.Since(start), 2*time.Minute)

		// worker-1 was tried again on resume and is done.
		assert.Equal(t, []string{"cp-1", "worker-1"}, eventNodes(talosStarts(c.Events(t), talosTo)))
	})

	t.Run("once it boots, resume finishes", func(t *testing.T) {
		setFaults("")

		require.NoError(t, talosEngineFor(t, c, tc, talosTo, memo, &lines{}).Run(ctx))
		requireTalosAt(t, c, tc, talosTo)
		assert.Equal(t, []string{"cp-1", "worker-1", "worker-2"}, eventNodes(talosStarts(c.Events(t), talosTo)))
	})
}

// TestTalosEngineMachineJoinsMidUpgrade starts a 1+2 cluster on Talos v1.12.4 with
// worker-2 powered off, and switches it on as the engine upgrades worker-1: worker-2
// boots and joins on v1.12.4 after the run read the cluster. The run does not say it
// succeeded with worker-2 behind: its last look pauses naming it, and the next run (a
// resume) upgrades it.
func TestTalosEngineMachineJoinsMidUpgrade(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  worker-2:\n    poweredOff: true\n"), 0o644))

	c := startCluster(t, "--control-planes", "1", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", talosFrom, "--faults", faults)
	tc := openTalos(t, c)
	memo := &memoMap{}
	ctx := context.Background()

	_, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "no Node worker-2 while it is off: %v", err)

	// worker-2 is switched on when worker-1's upgrade starts; worker-1's last line
	// waits for worker-2's Node to be Ready, so that the join lands before the run's
	// last look rather than race it.
	var (
		powerOn, joined sync.Once
		joinErr         error
	)

	progress := &lines{}
	progress.onLine = func(line string) {
		switch {
		case strings.HasPrefix(line, "TalosOS worker-1 Upgrading:"):
			powerOn.Do(func() { joinErr = os.WriteFile(faults, []byte("nodes: {}\n"), 0o644) })
		case strings.HasPrefix(line, "TalosOS worker-1 Done:"):
			joined.Do(func() {
				if joinErr == nil {
					joinErr = waitNodeReady(ctx, c, "worker-2", 5*time.Minute)
				}
			})
		}
	}

	err = talosEngineFor(t, c, tc, talosTo, memo, progress).Run(ctx)
	require.NoError(t, joinErr)

	var pause *engine.PauseError
	require.ErrorAs(t, err, &pause, "the run does not succeed with worker-2 behind: %v", err)
	t.Logf("paused: %v", err)
	assert.Equal(t, "TalosOS", pause.Stage)
	assert.Equal(t, "worker-2", pause.Node)
	assert.Contains(t, pause.Reason, "worker-2 (Talos "+talosFrom+") joined after the stages had read the cluster: behind the target "+talosTo)
	assert.Contains(t, pause.Action, "kubectl ichor resume")

	v, err := tc.Version(ctx, c.Machine(t, "worker-2").IP)
	require.NoError(t, err)
	assert.Equal(t, talosFrom, v, "worker-2 untouched by the run that missed it")

	require.NoError(t, talosEngineFor(t, c, tc, talosTo, memo, &lines{}).Run(ctx), "the next run takes worker-2")
	requireTalosAt(t, c, tc, talosTo)

	eventually(t, time.Minute, "the boots into "+talosTo, func(context.Context) error {
		if got := eventNodes(talosStarts(c.Events(t), talosTo)); !slices.Equal(got, []string{"cp-1", "worker-1", "worker-2"}) {
			return fmt.Errorf("boots into %s: %v", talosTo, got)
		}

		return nil
	})
}

// waitNodeReady waits, at most timeout, for node's Node to be Ready. It runs beside
// the test (in the engine's Progress), so it returns what went wrong rather than fail
// the test.
func waitNodeReady(ctx context.Context, c *Cluster, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	for {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil && nodeReady(n) {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready within %s (last: %v)", node, timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// TestTalosJobUpgrade runs a 3+2 Talos upgrade from v1.12.4 to v1.13.9 through the Job,
// as an operator would: `kubectl ichor upgrade talos`. The runner is killed while a
// control plane reboots (held down by a fault until the next runner has taken over): the
// next pod follows that node from the boot ID in the state, without calling Upgrade
// again. The node the first runner ran on is upgraded in its turn (its drain evicts the
// runner; a pod elsewhere finishes). Control planes go first, one node at a time.
// Launched with --etcd-snapshot: a valid etcd snapshot of the cluster's real etcd is
// saved through Talos before the Job (an existing file is refused, nothing launched).
func TestTalosJobUpgrade(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	c := startJobCluster(t, "--talos", talosFrom, "--faults", faults)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	u := watchUnavailable(t, c)
	runners := watchRunners(t, c)

	// --etcd-snapshot never overwrites: refused before anything changes.
	snapDir := t.TempDir()
	taken := filepath.Join(snapDir, "taken.db")
	require.NoError(t, os.WriteFile(taken, []byte("keep me"), 0o600))

	r := c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talosTo, "--yes", "--detach", "--etcd-snapshot", taken)
	r.requireOneLineError(t, "--etcd-snapshot "+taken+": the file exists: pass a new file name")
	jobs, err := c.Client.BatchV1().Jobs(jobNamespace).List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, jobs.Items, "nothing launched")

	snapshot := filepath.Join(snapDir, "etcd.db")
	start := time.Now()
	r = c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talosTo, "--yes", "--detach", "--etcd-snapshot", snapshot)
	r.requireExit(t, 0)
	require.Contains(t, r.stdout, "Stage 1/1 TalosOS")
	require.Contains(t, r.stdout, "Launched operation talos-v1-13-9-")
	requireEtcdSnapshot(t, snapshot, r.stdout)

	first := waitForRunner(t, c)
	require.NotEmpty(t, first)

	pod, err := c.Client.CoreV1().Pods(jobNamespace).Get(ctx, first, metav1.GetOptions{})
	require.NoError(t, err)

	firstNode := pod.Spec.NodeName
	t.Logf("the first runner %s runs on %s", first, firstNode)

	// A control plane other than the runner's (and other than cp-1, the endpoint of
	// talos.default) stays down after its upgrade until the next runner follows it.
	held := "cp-2"
	if firstNode == held {
		held = "cp-3"
	}

	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  "+held+":\n    neverBoots: true\n"), 0o644))
	t.Logf("%s: %s never boots", time.Now().Format("15:04:05.000"), held)

	eventually(t, 5*time.Minute, held+" rebooting", func(context.Context) error {
		op := c.operation(t)
		if op.Status.Phase != api.PhaseRunning {
			return fmt.Errorf("operation %s", op.Status.Phase)
		}

		if n := op.Status.Node(held); n != nil && n.Phase == string(engine.PhaseUpgrading) && strings.HasPrefix(n.Message, "rebooting") {
			return nil
		}

		return errors.New("not yet")
	})

	holder := lockHolderPod(t, c)
	require.NotEmpty(t, holder)

	zero := int64(0)
	require.NoError(t, c.Client.CoreV1().Pods(jobNamespace).Delete(ctx, holder, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	t.Logf("%s: killed the runner %s while %s rebooted", time.Now().Format("15:04:05.000"), holder, held)

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

	// The next runner says, in its own log, that it follows the node from its boot ID.
	var followed string

	eventually(t, 3*time.Minute, "the next runner following "+held, func(ctx context.Context) error {
		runner := c.operation(t).Status.Runner
		if runner == "" || runner == holder {
			return fmt.Errorf("runner %q", runner)
		}

		b, err := c.Client.CoreV1().Pods(jobNamespace).GetLogs(runner, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err
		}

		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, held+" Upgrading: following the upgrade to "+talosTo) {
				followed = line

				return nil
			}
		}

		return fmt.Errorf("runner %s does not follow %s yet", runner, held)
	})

	t.Logf("the next runner: %s", followed)

	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	r = c.ichor(t, 10*time.Minute, "status", "--watch")
	r.requireExit(t, 0)
	t.Logf("upgraded Talos on 3+2 from %s to %s through the Job in %s", talosFrom, talosTo, time.Since(start).Round(time.Millisecond))

	op, raw := c.statusDocument(t)
	assert.Equal(t, "Succeeded", raw["status"].(map[string]any)["phase"])
	assert.Equal(t, "talos", raw["spec"].(map[string]any)["upgrade"])
	assert.GreaterOrEqual(t, op.Status.Runs, 2, "the killed runner had a successor")
	marks := 0

	for k := range op.Status.Memo {
		if strings.HasSuffix(k, "/"+talosTo) {
			marks++
		}
	}

	assert.Equal(t, 5, marks, "a boot ID per node: %v", op.Status.Memo)
	assert.Equal(t, "", lockHolder(t, c), "the lock is released")

	requireTalosAt(t, c, tc, talosTo)
	requireNothingCordoned(t, c)
	assert.Len(t, u.max(), 1, "one node unavailable at a time: %v", u.max())

	// One boot into the target per node, one at a time, the control planes first.
	evs := c.Events(t)
	order := eventNodes(talosStarts(evs, talosTo))
	require.Len(t, order, 5)
	assert.ElementsMatch(t, controlPlanes, order[:3], "control planes first: %v", order)
	requireOneRebootAtATime(t, evs, order)
	assert.Empty(t, invariantBreaks(evs))

	// The held node rebooted once, though two runners saw it through; the first
	// runner's node was upgraded too (its drain evicts a runner still on it), and the
	// operation ended on a runner elsewhere or after that node was back.
	assert.Equal(t, 1, occurrences(order, held))
	assert.True(t, hasEvent(evs, firstNode, events.Talos, talosTo), "the first runner's node was upgraded")

	r = c.ichor(t, time.Minute, "logs")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "operation "+op.Spec.ID+" Succeeded")
	t.Logf("runner nodes: %v", runners.nodes())
	assert.Greater(t, len(runners.nodes()), 1, "runners on more than one node: %v", runners.nodes())
}

// requireEtcdSnapshot checks path is an etcd snapshot as etcd's Maintenance.Snapshot
// writes it, and etcdutl's snapshot status checks it: a bbolt database (its first meta
// page's magic 0xED0CDAED) of whole 512-byte blocks followed by the database's sha256;
// and that out reported its size and sha256.
func requireEtcdSnapshot(t *testing.T, path, out string) {
	t.Helper()

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(b), 4096+sha256.Size, "a snapshot holds a database")
	require.Equal(t, sha256.Size, len(b)%512, "the database (whole 512-byte blocks) and its sha256")

	db, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	want := sha256.Sum256(db)
	assert.Equal(t, want[:], sum, "the trailing sha256 is the database's: etcd's snapshot hash check")
	assert.Equal(t, uint32(0xED0CDAED), binary.LittleEndian.Uint32(db[16:20]), "bbolt's magic in the first meta page")

	file := sha256.Sum256(b)
	assert.Contains(t, out, fmt.Sprintf(" to %s: %d bytes, sha256 %s", path, len(b), hex.EncodeToString(file[:])))
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Saved the etcd snapshot") {
			t.Logf("%s", l)
		}
	}
}

func occurrences(list []string, s string) int {
	n := 0

	for _, v := range list {
		if v == s {
			n++
		}
	}

	return n
}

// runnerNodes records the node of every runner pod of an operation.
type runnerNodes struct {
	mu sync.Mutex
	by map[string]string // pod -> node
}

func watchRunners(t *testing.T, c *Cluster) *runnerNodes {
	t.Helper()

	r := &runnerNodes{by: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	go func() {
		for ctx.Err() == nil {
			pods, err := c.Client.CoreV1().Pods(jobNamespace).List(ctx, metav1.ListOptions{LabelSelector: job.LabelOperation})
			if err == nil {
				r.mu.Lock()
				for _, p := range pods.Items {
					if p.Spec.NodeName != "" {
						r.by[p.Name] = p.Spec.NodeName
					}
				}
				r.mu.Unlock()
			}

			time.Sleep(100 * time.Millisecond)
		}
	}()

	return r
}

// nodes are the distinct nodes runners ran on.
func (r *runnerNodes) nodes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()

	return slices.Compact(slices.Sorted(maps.Values(r.by)))
}
