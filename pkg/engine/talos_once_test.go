package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// TestDecide is the resume decision table: every step a mark can record
// against every state a node can report.
func TestDecide(t *testing.T) {
	const (
		target = "v1.13.9"
		old    = "v1.12.4"
		boot   = "boot-0"
		chosen = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.9"
	)

	// ev is machined's log showing an install in state s of the chosen installer.
	ev := func(s talos.InstallState) talos.Evidence { return talos.Evidence{State: s, Image: chosen} }

	marks := map[string]upgradeMark{
		"install":           {BootID: boot, Step: stepInstall},
		"installed":         {BootID: boot, Step: stepInstalled},
		"reboot":            {BootID: boot, Step: stepReboot},
		"no step":           {BootID: boot},
		"install, fellBack": {BootID: boot, Step: stepInstall},
		// MachineService.Upgrade answered (Talos before 1.13): the node reboots by itself.
		"legacy, reboot":  {BootID: boot, Step: stepReboot, Legacy: true},
		"legacy, install": {BootID: boot, Step: stepInstall, Legacy: true},
	}

	type node struct {
		seen nodeSeen
		// want by mark: install marks, installed-or-reboot marks, legacy marks
		install, installed, legacy resumeAction
	}

	nodes := map[string]node{
		"unreachable":                    {nodeSeen{}, actFollow, actFollow, actFollow},
		"rebooted, on the target":        {nodeSeen{reachable: true, bootID: "boot-1", version: target}, actVerify, actVerify, actVerify},
		"rebooted, on the old version":   {nodeSeen{reachable: true, bootID: "boot-1", version: old}, actFollow, actFollow, actFollow},
		"same boot, on the target":       {nodeSeen{reachable: true, bootID: boot, version: target, evidence: talos.Evidence{State: talos.InstallNone}}, actVerify, actVerify, actVerify},
		"same boot, no install":          {nodeSeen{reachable: true, bootID: boot, version: old, evidence: talos.Evidence{State: talos.InstallNone}}, actInstall, actReboot, actFollow},
		"same boot, install failed":      {nodeSeen{reachable: true, bootID: boot, version: old, evidence: ev(talos.InstallFailed)}, actInstall, actReboot, actInstall},
		"same boot, install running":     {nodeSeen{reachable: true, bootID: boot, version: old, evidence: ev(talos.InstallRunning)}, actWait, actReboot, actFollow},
		"same boot, installed":           {nodeSeen{reachable: true, bootID: boot, version: old, evidence: ev(talos.InstallDone)}, actReboot, actReboot, actFollow},
		"same boot, log no longer there": {nodeSeen{reachable: true, bootID: boot, version: old, evidence: talos.Evidence{State: talos.InstallUnknown}}, actPause, actReboot, actFollow},
		// The log of MachineService.Upgrade's sequence, whatever the mark says.
		"same boot, upgrade sequence": {nodeSeen{reachable: true, bootID: boot, version: old, evidence: ev(talos.InstallSequence)}, actFollow, actFollow, actFollow},
		// Another installer's install, or one the log no longer names: never rebooted into.
		"same boot, another version installed": {nodeSeen{reachable: true, bootID: boot, version: old,
			evidence: talos.Evidence{State: talos.InstallDone, Image: "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.8"}},
			actForeign, actReboot, actFollow},
		"same boot, the target from another installer": {nodeSeen{reachable: true, bootID: boot, version: old,
			evidence: talos.Evidence{State: talos.InstallDone, Image: "ghcr.io/siderolabs/installer:v1.13.9"}}, actForeign, actReboot, actFollow},
		"same boot, installed, its installer no longer in the log": {nodeSeen{reachable: true, bootID: boot, version: old,
			evidence: talos.Evidence{State: talos.InstallDone}}, actForeign, actReboot, actFollow},
		"same boot, another installer running": {nodeSeen{reachable: true, bootID: boot, version: old,
			evidence: talos.Evidence{State: talos.InstallRunning, Image: "ghcr.io/siderolabs/installer:v1.13.9"}}, actForeign, actReboot, actFollow},
		"same boot, an install running, its installer not named": {nodeSeen{reachable: true, bootID: boot, version: old,
			evidence: talos.Evidence{State: talos.InstallRunning}}, actWait, actReboot, actFollow},
		// machined's log could not be read: it alone says what the boot did.
		"same boot, log unreadable": {nodeSeen{reachable: true, bootID: boot, version: old, evidenceErr: errors.New("deadline exceeded")},
			actUnread, actReboot, actUnread},
	}

	for mn, mark := range marks {
		for nn, n := range nodes {
			want := n.installed

			switch {
			case mark.Legacy:
				want = n.legacy
			case mark.step() == stepInstall:
				want = n.install
			}

			assert.Equal(t, want.String(), decide(mark, n.seen, target, chosen).String(), "mark %s, node %s", mn, nn)
		}
	}
}

// TestTalosLegacyUpgradeOnce: on a Talos before 1.13 the Install is
// MachineService.Upgrade, which reboots the node by itself: one call per
// node, no Reboot call, even when cp-2's call answers Unavailable after its
// sequence started (machined's log says it runs: followed, not called again)
// and when the run is stopped after worker-1's call and a new one resumes.
func TestTalosLegacyUpgradeOnce(t *testing.T) {
	o := newFakeOS(t, talosSpec())

	for name := range o.machines {
		o.setFaults(name, func(f *osFaults) { f.legacy, f.rebootLag = true, 300*time.Millisecond })
	}

	o.setFaults("cp-2", func(f *osFaults) { f.installBreaks = true })

	memo := newMemo()
	ctx, cancel := context.WithCancel(context.Background())
	o.onUpgrade = func(_ context.Context, name string) (bool, error) {
		if name == "worker-1" {
			cancel() // the runner dies just after worker-1's call
		}

		return false, nil
	}

	rec := &recorder{}
	e := o.engine("v1.13.9", memo)
	e.Progress = rec

	require.Error(t, e.Run(ctx), "stopped after worker-1's call")

	o.onUpgrade = nil
	e = o.engine("v1.13.9", memo)
	e.Progress = rec
	require.NoError(t, e.Run(context.Background()))

	requireTalosFinished(t, o, "v1.13.9")
	assert.Len(t, o.upgradeNodes(), 5, "one Upgrade call per node: %v", o.upgradeNodes())
	assert.NotEmpty(t, rec.with("TalosOS cp-2 Upgrading: the Install call broke off"))

	for name := range o.machines {
		assert.Zero(t, o.state(name).reboots, "%s: no Reboot call, the sequence reboots by itself", name)
	}
}

// TestTalosInstallBreaksOff: the Install call installs, then its stream
// breaks (Unavailable) while the node stays up: the node's log says it
// installed, so it is rebooted, never installed again.
func TestTalosInstallBreaksOff(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setFaults("cp-2", func(f *osFaults) { f.installBreaks = true })
	o.setFaults("worker-1", func(f *osFaults) { f.installBreaks = true })

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo())
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Len(t, o.upgradeNodes(), 5, "one Install per node: %v", o.upgradeNodes())
	assert.NotEmpty(t, rec.with("TalosOS cp-2 Upgrading: the Install call broke off"))
	assert.NotEmpty(t, rec.with("TalosOS cp-2 Upgrading: boot", "machined's log: installed, waiting for a reboot"))
	assert.NotEmpty(t, rec.with("TalosOS cp-2 Upgrading: Talos v1.13.9 installed in boot"))
}

// TestTalosInstallNeverReached: the Install call breaks off before it
// reaches the node (nothing installed): it is tried again.
// unavailable is a gRPC Unavailable status, as a broken stream answers.
func unavailable(msg string) error { return status.Error(codes.Unavailable, msg) }

func TestTalosInstallNeverReached(t *testing.T) {
	o := newFakeOS(t, talosSpec())

	calls := map[string]int{}
	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		calls[node]++
		if node == "worker-2" && calls[node] == 1 {
			return true, fmt.Errorf("rpc error: code = Unavailable desc = connection reset")
		}

		return false, nil
	}
	// The hook's error is not a gRPC status: make it one.
	inner := o.onUpgrade
	o.onUpgrade = func(ctx context.Context, node string) (bool, error) {
		skip, err := inner(ctx, node)
		if err != nil {
			return skip, unavailable(err.Error())
		}

		return skip, nil
	}

	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Len(t, o.upgradeNodes(), 5, "one Install that took per node: %v", o.upgradeNodes())
	assert.Equal(t, 2, calls["worker-2"], "tried again once the node said nothing ran")
}

// TestTalosKilledBetweenInstallAndReboot: the runner dies once the install
// ended, before it recorded it or asked the reboot; the next runner finds
// the node in the same boot with the install done and only reboots it.
func TestTalosKilledBetweenInstallAndReboot(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	ctx, cancel := context.WithCancel(context.Background())

	defer cancel()

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "cp-2" {
			cancel()
		}

		return false, nil
	}

	require.ErrorIs(t, o.engine("v1.13.9", memo).Run(ctx), context.Canceled)
	assert.Equal(t, 0, o.state("cp-2").reboots, "not rebooted by the first runner")

	var mark upgradeMark
	require.NoError(t, json.Unmarshal([]byte(memo.all()["talos/cp-2/v1.13.9"]), &mark))
	assert.Equal(t, stepInstall, mark.Step, "the install announced, its end never recorded")

	o.onUpgrade = nil
	rec := &recorder{}
	e := o.engine("v1.13.9", memo)
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Len(t, o.upgradeNodes(), 5, "one Install per node: %v", o.upgradeNodes())
	assert.NotEmpty(t, rec.with("TalosOS cp-2 Upgrading: Talos v1.13.9 installed in boot"))
}

// TestTalosLogRolledPauses: the runner dies mid-install and the node's log no
// longer says whether it installed: the next run pauses, the node cordoned,
// rather than install a second time.
func TestTalosLogRolledPauses(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	ctx, cancel := context.WithCancel(context.Background())

	defer cancel()

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "cp-2" {
			cancel()

			return true, context.Canceled // nothing installed, but the log will not say so
		}

		return false, nil
	}

	require.ErrorIs(t, o.engine("v1.13.9", memo).Run(ctx), context.Canceled)

	o.onUpgrade = nil
	o.setFaults("cp-2", func(f *osFaults) { f.logRolled = true })

	err := o.engine("v1.13.9", memo).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "cp-2", "no longer reaches back", "the node stays cordoned")
	assert.Contains(t, p.Action, "talosctl -n")
	assert.Equal(t, []string{"cp-1"}, o.upgradeNodes(), "no second install")
	assert.Equal(t, []string{"cp-2"}, o.f.cordonedByIchor())
}

// TestTalosMarkNotWritten: the state refuses the install's mark: nothing is
// called, the run pauses naming the node, which stays cordoned.
func TestTalosMarkNotWritten(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	memo.refuse = fmt.Errorf("admission webhook denied the request")

	err := o.engine("v1.13.9", memo).Run(context.Background())
	requirePause(t, err, "TalosOS", "cp-1", "record the install step of its upgrade in the state", "admission webhook denied", "nothing was called")
	assert.Empty(t, o.upgradeNodes())
}

// TestTalosInstalledWithoutRecord: a node already holds the target installed in
// its current boot (an earlier operation aborted between its install and its
// reboot) and the state has no mark of it: the node says so, and it is only
// rebooted, never installed twice.
func TestTalosInstalledWithoutRecord(t *testing.T) {
	o := newFakeOS(t, talosSpec())

	m := o.machine("worker-1")
	o.mu.Lock()
	m.staged, m.installed, m.image = "v1.13.9", talos.InstallDone, "ghcr.io/siderolabs/installer:v1.13.9"
	o.mu.Unlock()

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo())
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotContains(t, o.upgradeNodes(), "worker-1", "no second install")
	assert.Len(t, o.upgradeNodes(), 4)
	assert.Equal(t, "v1.13.9", o.state("worker-1").version)
	assert.NotEmpty(t, rec.with("TalosOS worker-1 Upgrading: Talos v1.13.9 installed in boot"))
}
