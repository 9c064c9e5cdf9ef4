//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// The Talos upgrade's safety at the moment of each call (issue 24): the etcd
// gate right before a control plane's reboot, an install found staged that
// is not the chosen one, a machined log that does not answer, an Install
// call that runs out its bound while the installer runs on.

// factoryInstaller is the factory installer of schematic at version.
func factoryInstaller(schematic, version string) string {
	return "factory.talos.dev/metal-installer/" + schematic + ":" + version
}

// withEmptySchematic returns the simulator's flags that install each of c's
// machines (names) from the empty schematic.
func withEmptySchematic(names ...string) []string {
	var args []string
	for _, n := range names {
		args = append(args, "--schematic", n+"="+emptySchematic)
	}

	return args
}

// faultsFile returns a faults file for the simulator and a function that
// rewrites it.
func faultsFile(t *testing.T) (string, func(doc string)) {
	t.Helper()

	path := filepath.Join(t.TempDir(), "faults.yaml")
	set := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
	}
	set("nodes: {}\n")

	return path, set
}

// installsOf counts the simulator's talos-install events, by node.
func installsOf(t *testing.T, c *Cluster) map[string]int {
	t.Helper()

	n := map[string]int{}

	for _, e := range c.Events(t) {
		if e.Component == events.TalosInstall {
			n[e.Node]++
		}
	}

	return n
}

// TestTalosEtcdGateAtTheReboot upgrades Talos 3+2 from v1.13.9 to v1.14.1
// through the Job. cp-1's install takes 20 s (fault installTakes) and cp-3's
// etcd member is stopped while it runs, after the gate before cp-1's cordon
// passed: cp-1 is not rebooted; the operation pauses on cp-1 naming cp-3 and
// how to look at it, cp-1 cordoned with Talos v1.14.1 installed for its next
// boot (its machined log says so). Once cp-3's etcd runs again, resume
// reboots cp-1 without a second install and finishes.
func TestTalosEtcdGateAtTheReboot(t *testing.T) {
	t.Parallel()

	faults, setFaults := faultsFile(t)
	setFaults("nodes:\n  cp-1:\n    installTakes: 20s\n")

	args := append([]string{"--kubernetes", kube136, "--talos", talos113, "--faults", faults},
		withEmptySchematic("cp-1", "cp-2", "cp-3", "worker-1", "worker-2")...)
	c := startJobCluster(t, args...)
	addWorkload(t, c, 2)

	ctx := context.Background()
	tc := openTalos(t, c)
	cp1, cp3 := c.Machine(t, "cp-1").IP, c.Machine(t, "cp-3").IP
	chosen := factoryInstaller(emptySchematic, talos114)

	r := c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talos114, "--yes", "--detach")
	r.requireExit(t, 0)

	eventually(t, 5*time.Minute, "cp-1 installing", func(context.Context) error {
		if installsOf(t, c)["cp-1"] > 0 {
			return nil
		}

		return errors.New("no install on cp-1 yet")
	})

	setFaults("nodes:\n  cp-1:\n    installTakes: 20s\n  cp-3:\n    etcdStopped: true\n")
	t.Logf("%s: cp-1 installs; cp-3's etcd member stopped", time.Now().Format("15:04:05.000"))

	r = c.ichor(t, 5*time.Minute, "status", "--watch")
	r.requireExit(t, job.ExitPaused)

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	t.Logf("paused: %s\naction: %s", op.Status.Reason, op.Status.Action)
	assert.Equal(t, "cp-1", op.Status.PausedNode)
	assert.Contains(t, op.Status.Reason, "etcd is not healthy right before its reboot: member cp-3 does not answer etcd status")
	assert.Contains(t, op.Status.Reason, "cp-1 is not rebooted while it is: the node stays cordoned, Talos v1.14.1 stays installed for its next boot")
	assert.Contains(t, op.Status.Action, "talosctl -n "+cp3+" etcd status")

	assert.Empty(t, talosStarts(c.Events(t), talos114), "nothing rebooted into v1.14.1")

	n, err := c.Client.CoreV1().Nodes().Get(ctx, "cp-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable, "cp-1 stays cordoned")

	ev, err := tc.InstallEvidence(ctx, cp1)
	require.NoError(t, err)
	assert.Equal(t, talos.InstallDone, ev.State, "cp-1's install kept: %s", ev)
	assert.Equal(t, chosen, ev.Image)

	setFaults("nodes: {}\n")
	c.ichor(t, 3*time.Minute, "resume", "--detach").requireExit(t, 0)
	c.ichor(t, 15*time.Minute, "status", "--watch").requireExit(t, 0)

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)
	assert.Equal(t, map[string]int{"cp-1": 1, "cp-2": 1, "cp-3": 1, "worker-1": 1, "worker-2": 1}, installsOf(t, c), "one install per node")
	assert.ElementsMatch(t, []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}, eventNodes(talosStarts(c.Events(t), talos114)), "one boot into v1.14.1 per node")
}

// TestTalosStagedInstallNotBooted: cp-1 holds, in its current boot, an
// install a `talosctl upgrade --no-reboot` left (its pull and
// LifecycleService.Upgrade): Talos v1.14.1 from another schematic's factory
// installer, the right version from the wrong image. A new operation through
// the Job pauses on cp-1 saying what is staged and how to replace it, and
// neither reboots into it nor installs over it. After `talosctl rollback`
// (MachineService.Rollback: cp-1 reboots into the v1.13.9 it runs, the
// staged install dropped) the operator resumes as soon as cp-1 answers in its
// new boot, its Node still starting (NotReady, fault stayNotReady): the Job's
// checks wait for it, saying so on its line, and once it is Ready it installs
// the chosen installer and finishes.
func TestTalosStagedInstallNotBooted(t *testing.T) {
	t.Parallel()

	faults, setFaults := faultsFile(t)
	c := startJobCluster(t, append([]string{"--control-planes", "1", "--workers", "1", "--kubernetes", kube136, "--talos", talos113, "--faults", faults},
		withEmptySchematic("cp-1", "worker-1")...)...)

	ctx := context.Background()
	tc := openTalos(t, c)
	cp1 := c.Machine(t, "cp-1").IP
	chosen, wrong := factoryInstaller(emptySchematic, talos114), factoryInstaller(e2eSchematic, talos114)

	installCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	rebooting, err := tc.Install(installCtx, cp1, wrong)

	cancel()
	require.NoError(t, err)
	require.False(t, rebooting)

	ev, err := tc.InstallEvidence(ctx, cp1)
	require.NoError(t, err)
	require.Equal(t, talos.InstallDone, ev.State)
	require.Equal(t, wrong, ev.Image, "machined logged the installer it ran")

	r := c.ichor(t, 10*time.Minute, "upgrade", "talos", "--to", talos114, "--allow-etcd-outage", "--yes")
	r.requireExit(t, job.ExitPaused)

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	t.Logf("paused: %s\naction: %s", op.Status.Reason, op.Status.Action)
	assert.Equal(t, "cp-1", op.Status.PausedNode)
	assert.Contains(t, op.Status.Reason, "Talos v1.14.1 from "+wrong+" (the target, from another installer than the chosen one")
	assert.Contains(t, op.Status.Reason, "is installed in its current boot for its next reboot (machined's log), not the installer chosen for this operation, "+chosen)
	assert.Contains(t, op.Status.Reason, "it is not rebooted into it; the node stays cordoned")
	assert.NotContains(t, op.Status.Reason, "A/B fallback")
	assert.Contains(t, op.Status.Action, "talosctl -n "+cp1+" rollback")
	assert.Empty(t, talosStarts(c.Events(t), talos114), "not rebooted into it")
	assert.Equal(t, 1, installsOf(t, c)["cp-1"], "no install over it")

	// The operator drops the staged install as the pause says: talosctl rollback.
	mc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Close() })

	before, err := tc.BootID(ctx, cp1)
	require.NoError(t, err)

	setFaults("nodes:\n  cp-1:\n    stayNotReady: true\n") // its runtime and network slow to come up
	require.NoError(t, mc.Rollback(client.WithNode(ctx, cp1)))

	// The operator resumes as soon as the node answers: on v1.13.9 in a new boot,
	// its Node NotReady, starting.
	awaitStartingBoot(t, c, tc, "cp-1", before)

	v, err := tc.Version(ctx, cp1)
	require.NoError(t, err)
	require.Equal(t, talos113, v, "the rollback's version")

	c.ichor(t, 3*time.Minute, "resume", "--detach").requireExit(t, 0)
	awaitJobWaitsFor(t, c, "cp-1")

	setFaults("nodes: {}\n") // the node comes Ready

	c.ichor(t, 10*time.Minute, "status", "--watch").requireExit(t, 0)

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)
	assert.Equal(t, map[string]int{"cp-1": 2, "worker-1": 1}, installsOf(t, c), "cp-1: the staged install, then the chosen one")
	assert.Equal(t, []string{"cp-1", "worker-1"}, eventNodes(talosStarts(c.Events(t), talos114)), "one boot into v1.14.1 per node")
	assert.Equal(t, []string{"schematic " + emptySchematic}, extensionsOf(t, tc, c, "cp-1"), "cp-1 booted the chosen installer's Talos")
}

// TestTalosSlowLogAndInstallBound: on a 1+1 cluster (Talos v1.13.9 ->
// v1.14.1, engine bounds of 20 s), worker-1's machined log answers only after
// a minute (fault logSlow): its read has its own bound, and the upgrade
// pauses naming worker-1 once the install bound passed, nothing installed,
// the node cordoned. Then its install takes 30 s (fault installTakes),
// longer than the Install call's bound: the node is asked what it did, and
// once its installer ends it is rebooted into the install, once.
func TestTalosSlowLogAndInstallBound(t *testing.T) {
	t.Parallel()

	faults, setFaults := faultsFile(t)
	setFaults("nodes:\n  worker-1:\n    logSlow: 1m\n")

	c := startCluster(t, append([]string{"--control-planes", "1", "--workers", "1", "--kubernetes", kube136, "--talos", talos113, "--faults", faults},
		withEmptySchematic("cp-1", "worker-1")...)...)

	ctx := context.Background()
	tc := openTalos(t, c)
	memo := &memoMap{}
	rec := &lines{}

	engine := func() error {
		e := talosEngineFor(t, c, tc, talos114, memo, rec)
		e.Options.UpgradeTimeout = 20 * time.Second

		return e.Run(ctx)
	}

	start := time.Now()
	err := engine()
	t.Logf("after %s: %v", time.Since(start).Round(time.Second), err)

	pause := requireEnginePause(t, err, "worker-1")
	assert.Contains(t, pause.Reason, `node "worker-1": its machined log could not be read within 20s`)
	assert.Contains(t, pause.Reason, "the node stays cordoned")
	assert.Less(t, time.Since(start), 3*time.Minute)
	assert.Zero(t, installsOf(t, c)["worker-1"], "no install without the node's word")

	n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable, "worker-1 stays cordoned")

	setFaults("nodes:\n  worker-1:\n    installTakes: 30s\n")

	require.NoError(t, engine())
	requireTalosAt(t, c, tc, talos114)
	assert.Equal(t, map[string]int{"cp-1": 1, "worker-1": 1}, installsOf(t, c), "one install per node")
	assert.NotEmpty(t, linesWith(rec, "TalosOS worker-1 Upgrading: the Install call ran out its bound of 20s"))
	assert.NotEmpty(t, linesWith(rec, "TalosOS worker-1 Upgrading: an install runs on the node (machined's log): waiting for it to end"))
}

// requireEnginePause requires err to be the engine's pause on node.
func requireEnginePause(t *testing.T, err error, node string) *engine.PauseError {
	t.Helper()

	var pause *engine.PauseError
	require.ErrorAs(t, err, &pause, "want a pause, got %v", err)
	assert.Equal(t, node, pause.Node, "paused on %s: %s", pause.Node, pause.Reason)

	return pause
}

// linesWith returns the progress lines that hold every word.
func linesWith(l *lines, words ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()

	var out []string

	for _, line := range l.all {
		all := true

		for _, w := range words {
			all = all && strings.Contains(line, w)
		}

		if all {
			out = append(out, line)
		}
	}

	return out
}

// TestTalosUpgradeWaitsForAStartingNode: worker-1 was rebooted a moment ago and
// its Node is still starting (its kubelet posts NotReady: fault stayNotReady)
// when the operator upgrades Talos. The plan warns, naming it, rather than
// refuse; the Job's checks wait for it, saying so on its line, and once it is
// Ready the upgrade goes on and finishes.
func TestTalosUpgradeWaitsForAStartingNode(t *testing.T) {
	t.Parallel()

	faults, setFaults := faultsFile(t)
	c := startJobCluster(t, append([]string{"--control-planes", "1", "--workers", "1", "--kubernetes", kube136, "--talos", talos113, "--faults", faults},
		withEmptySchematic("cp-1", "worker-1")...)...)

	ctx := context.Background()
	tc := openTalos(t, c)
	w1 := c.Machine(t, "worker-1").IP

	mc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Close() })

	before, err := tc.BootID(ctx, w1)
	require.NoError(t, err)

	setFaults("nodes:\n  worker-1:\n    stayNotReady: true\n") // its runtime and network slow to come up
	require.NoError(t, mc.Reboot(client.WithNode(ctx, w1)))

	awaitStartingBoot(t, c, tc, "worker-1", before)

	r := c.ichor(t, 3*time.Minute, "upgrade", "talos", "--to", talos114, "--allow-etcd-outage", "--yes", "--detach")
	r.requireExit(t, 0)
	assert.Contains(t, r.stdout, "starting: worker-1 (NotReady since ", "the plan warns")

	awaitJobWaitsFor(t, c, "worker-1")

	assert.Empty(t, talosStarts(c.Events(t), talos114), "nothing upgraded while it starts")

	setFaults("nodes: {}\n") // the node comes Ready

	c.ichor(t, 10*time.Minute, "status", "--watch").requireExit(t, 0)

	requireTalosAt(t, c, tc, talos114)
	requireNothingCordoned(t, c)
}

// awaitStartingBoot waits until machine name answers in a boot other than before,
// its Node's kubelet posting NotReady: back from a reboot, still starting.
func awaitStartingBoot(t *testing.T, c *Cluster, tc *countingTalos, name, before string) {
	t.Helper()

	ip := c.Machine(t, name).IP

	eventually(t, 2*time.Minute, name+" back in a new boot, its kubelet posting NotReady", func(ctx context.Context) error {
		if boot, err := tc.BootID(ctx, ip); err != nil || boot == before {
			return fmt.Errorf("boot %q (%v)", boot, err)
		}

		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if discovery.NotReadySince(n).IsZero() {
			return fmt.Errorf("node %s not posting NotReady: %v", name, n.Status.Conditions)
		}

		return nil
	})
}

// awaitJobWaitsFor waits until the Job's line for node says its checks wait for it
// to start.
func awaitJobWaitsFor(t *testing.T, c *Cluster, node string) {
	t.Helper()

	eventually(t, 2*time.Minute, "the Job's checks waiting for "+node+" to start", func(context.Context) error {
		for _, n := range c.operation(t).Status.Nodes {
			if n.Name == node && strings.Contains(n.Message, "starting: NotReady") {
				return nil
			}
		}

		return errors.New(node + "'s line says no wait")
	})
}
