package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// The Talos upgrade's gates at the moment of the call, and what the engine
// does with a node's word on its installs: the tests of issue 24's items 1,
// 3, 4, 5, 6 and 10 on the fake cluster.

// TestTalosEtcdGateRightBeforeTheReboot: cp-3's etcd member stops while
// cp-1 installs (after the gate before cp-1's cordon passed): cp-1 is not
// rebooted; the run pauses naming cp-3, cp-1 cordoned with its install kept;
// once cp-3 runs again, a resume reboots cp-1 without a second install.
func TestTalosEtcdGateRightBeforeTheReboot(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "cp-1" {
			o.setFaults("cp-3", func(f *osFaults) { f.etcdStopped = true })
		}

		return false, nil
	}

	err := o.engine("v1.13.9", memo).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "cp-1", "etcd is not healthy right before its reboot", "member cp-3 does not answer etcd status",
		"cp-1 is not rebooted while it is", "the node stays cordoned, Talos v1.13.9 stays installed for its next boot")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.13 etcd status")
	assert.Contains(t, p.Action, "rollback")
	assert.Zero(t, o.state("cp-1").reboots, "cp-1 not rebooted")
	assert.Equal(t, "v1.13.9", o.state("cp-1").staged, "its install kept")
	assert.Equal(t, []string{"cp-1"}, o.f.cordonedByIchor())
	assert.Equal(t, []string{"cp-1"}, o.upgradeNodes())

	o.onUpgrade = nil
	o.setFaults("cp-3", func(f *osFaults) { f.etcdStopped = false })

	require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Len(t, o.upgradeNodes(), 5, "one install per node: %v", o.upgradeNodes())
}

// TestTalosEtcdGateOnResume: a resumed run reaches cp-2's reboot (its
// install done by a runner that died) or its install (the runner died as it
// announced it, on Talos 1.13 and on 1.12, whose MachineService.Upgrade
// installs and reboots in one call) while cp-3's etcd is stopped: it pauses
// naming cp-3 and cp-2 is not rebooted.
func TestTalosEtcdGateOnResume(t *testing.T) {
	for _, tc := range []struct {
		name    string
		legacy  bool
		install bool // the first runner dies before cp-2's install took
		want    string
	}{
		{name: "the reboot of an install a dead runner made", want: "right before its reboot"},
		{name: "an install announced by a dead runner", install: true, want: "right before its install"},
		{name: "MachineService.Upgrade announced by a dead runner", legacy: true, install: true, want: "right before its install"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			o := newFakeOS(t, talosSpec())
			if tc.legacy {
				for name := range o.machines {
					o.setFaults(name, func(f *osFaults) { f.legacy = true })
				}
			}

			memo := newMemo()
			ctx, cancel := context.WithCancel(context.Background())

			defer cancel()

			o.onUpgrade = func(_ context.Context, node string) (bool, error) {
				if node != "cp-2" {
					return false, nil
				}

				cancel()

				if tc.install {
					return true, context.Canceled // nothing reached the node
				}

				return false, context.Canceled // installed; the runner gone before its answer
			}

			require.ErrorIs(t, o.engine("v1.13.9", memo).Run(ctx), context.Canceled)
			require.Zero(t, o.state("cp-2").reboots)

			o.onUpgrade = nil
			o.setFaults("cp-3", func(f *osFaults) { f.etcdStopped = true })

			err := o.engine("v1.13.9", memo).Run(context.Background())
			requirePause(t, err, "TalosOS", "cp-2", "etcd is not healthy "+tc.want, "member cp-3 does not answer etcd status", "the node stays cordoned")
			assert.Zero(t, o.state("cp-2").reboots, "cp-2 not rebooted")
			assert.Equal(t, "v1.12.4", o.state("cp-2").version)
			assert.Contains(t, o.f.cordonedByIchor(), "cp-2")

			if tc.install {
				assert.NotContains(t, o.upgradeNodes(), "cp-2", "no install while etcd is not healthy")
			}
		})
	}
}

// TestTalosStagedConfigRefused: a node with a machine config change staged
// for its next boot is refused before its cordon, naming it; one staged
// while the node installs is refused right before its reboot, the node
// cordoned and not rebooted.
func TestTalosStagedConfigRefused(t *testing.T) {
	stage := func(t *testing.T, o *fakeOS, node string) {
		t.Helper()

		m := o.f.machine(node)

		o.f.mu.Lock()
		defer o.f.mu.Unlock()

		staged, err := m.active.PatchV1Alpha1(func(c *v1alpha1.Config) error {
			c.MachineConfig.MachineNodeLabels = map[string]string{"rack": "r2"}

			return nil
		})
		require.NoError(t, err)

		m.persistent = reloadConfig(t, staged)
	}

	t.Run("at the stage's start", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		stage(t, o, "worker-1")

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		p := pauseOf(t, err, "TalosOS", "worker-1", "checks: a machine config change is staged for the next reboot, which the upgrade's would activate",
			"worker-1 (at machine.nodeLabels.rack)")
		assert.Contains(t, p.Action, "talosctl -n 10.0.0.21 reboot")
		assert.Empty(t, o.upgradeNodes(), "nothing upgraded")
		assert.Empty(t, o.f.cordonedByIchor())
	})

	t.Run("staged after the stage's start, before its cordon", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.onUpgrade = func(_ context.Context, node string) (bool, error) {
			if node == "cp-1" {
				stage(t, o, "worker-1")
			}

			return false, nil
		}

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "worker-1", `node "worker-1": a machine config change is staged for the next reboot`,
			"machine.nodeLabels.rack", "the upgrade's reboot would activate it", "nothing was changed on it")
		assert.NotContains(t, o.upgradeNodes(), "worker-1")
		assert.Empty(t, o.f.cordonedByIchor())
	})

	t.Run("staged while it installs", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.onUpgrade = func(_ context.Context, node string) (bool, error) {
			if node == "cp-2" {
				stage(t, o, "cp-2")
			}

			return false, nil
		}

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "cp-2", "staged for the next reboot", "its reboot is not made: the node stays cordoned, Talos v1.13.9 stays installed")
		assert.Zero(t, o.state("cp-2").reboots)
		assert.Equal(t, []string{"cp-2"}, o.f.cordonedByIchor())
	})
}

// TestTalosForeignInstallNotBooted: a node holds, in its current boot, an
// install an earlier operation (or talosctl upgrade --no-reboot) left
// staged: another version, or the target from another installer. A new
// operation pauses naming what is staged and how to replace it, and neither
// installs over it nor reboots into it.
func TestTalosForeignInstallNotBooted(t *testing.T) {
	for _, tc := range []struct {
		name, image, version, want string
	}{
		{name: "another version", image: "ghcr.io/siderolabs/installer:v1.13.8", version: "v1.13.8", want: "Talos v1.13.8 from ghcr.io/siderolabs/installer:v1.13.8"},
		{
			name: "the target from another installer", image: "factory.talos.dev/metal-installer/5a8a2c5d1c6e:v1.13.9", version: "v1.13.9",
			want: "the target, from another installer than the chosen one",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newFakeOS(t, talosSpec())

			m := o.machine("worker-1")
			o.mu.Lock()
			m.staged, m.installed, m.image = tc.version, talos.InstallDone, tc.image
			o.mu.Unlock()

			err := o.engine("v1.13.9", newMemo()).Run(context.Background())
			p := pauseOf(t, err, "TalosOS", "worker-1", tc.want, "is installed in its current boot for its next reboot",
				"not the installer chosen for this operation, ghcr.io/siderolabs/installer:v1.13.9", "it is not rebooted into it", "the node stays cordoned")
			assert.NotContains(t, p.Reason, "A/B fallback")
			assert.Contains(t, p.Action, "talosctl -n 10.0.0.21 rollback")
			assert.Contains(t, p.Action, "a second install in this boot would write the running boot slot")
			assert.Zero(t, o.state("worker-1").reboots, "not rebooted into it")
			assert.NotContains(t, o.upgradeNodes(), "worker-1", "no install over it")
			assert.Equal(t, "v1.12.4", o.state("worker-1").version)
		})
	}
}

// TestTalosOtherVersionIsNoFallback: a node that reboots into neither the
// target nor the version it ran did not fall back: the pause says so.
func TestTalosOtherVersionIsNoFallback(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
	// Another install over ichor's in the same boot: the reboot boots v1.13.8.
	o.setFaults("worker-1", func(f *osFaults) { f.bootsVersion = "v1.13.8" })

	err := o.engine("v1.13.9", newMemo()).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "worker-1", "into Talos v1.13.8, neither the target v1.13.9 nor the v1.12.4 it ran",
		"not an A/B fallback")
	assert.NotContains(t, p.Reason, "went back to the previous boot slot")
}

// TestTalosEvidenceBounded: a resumed run finds cp-2 in the boot its install
// was announced in, and machined's log does not answer: it reads it again
// within the install's bound, then pauses naming the node; it does not take
// the node for unreachable and follow it forever.
func TestTalosEvidenceBounded(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	ctx, cancel := context.WithCancel(context.Background())

	defer cancel()

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		if node == "cp-2" {
			cancel()

			return true, context.Canceled
		}

		return false, nil
	}

	require.ErrorIs(t, o.engine("v1.13.9", memo).Run(ctx), context.Canceled)

	o.onUpgrade = nil
	o.setFaults("cp-2", func(f *osFaults) { f.logSlow = true })

	bounded, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()

	start := time.Now()
	err := o.engine("v1.13.9", memo, func(opts *Options) { opts.UpgradeTimeout = time.Second }).Run(bounded)
	p := pauseOf(t, err, "TalosOS", "cp-2", `node "cp-2": its machined log could not be read within 1s`, "whether an install ran in boot", "the node stays cordoned")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.12 logs machined")
	assert.Less(t, time.Since(start), 20*time.Second)
	assert.Equal(t, []string{"cp-1"}, o.upgradeNodes(), "no install without the node's word")
	assert.Equal(t, []string{"cp-2"}, o.f.cordonedByIchor())
}

// TestTalosInstallDeadline: the Install call runs out its bound while the
// installer runs on: the node stays cordoned and is asked what it did. An
// install that completed (the answer lost, or the installer done a moment
// later) is rebooted into, once; one still running at the bound pauses
// saying an install may be pending. None is uncordoned as if nothing had
// changed.
func TestTalosInstallDeadline(t *testing.T) {
	short := func(upgrade, reboot time.Duration) func(*Options) {
		return func(opts *Options) { opts.UpgradeTimeout, opts.RebootTimeout = upgrade, reboot }
	}

	t.Run("installed, the answer never came", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("worker-1", func(f *osFaults) { f.installHangs = true })

		rec := &recorder{}
		e := o.engine("v1.13.9", newMemo(), short(300*time.Millisecond, 5*time.Second))
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
		assert.Len(t, o.upgradeNodes(), 5, "one install per node: %v", o.upgradeNodes())
		assert.NotEmpty(t, rec.with("TalosOS worker-1 Upgrading: the Install call ran out its bound of 300ms", "asking it what it did"))
		assert.NotEmpty(t, rec.with("TalosOS worker-1 Upgrading: Talos v1.13.9 installed in boot"))
	})

	t.Run("the installer ends after the call's bound", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setFaults("worker-1", func(f *osFaults) { f.installTakes = 1500 * time.Millisecond })

		rec := &recorder{}
		e := o.engine("v1.13.9", newMemo(), short(300*time.Millisecond, 5*time.Second))
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
		assert.Len(t, o.upgradeNodes(), 2, "one install per node: %v", o.upgradeNodes())
		assert.NotEmpty(t, rec.with("TalosOS worker-1 Upgrading: an install runs on the node (machined's log): waiting for it to end"))
	})

	t.Run("the installer still runs at the bound", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setFaults("worker-1", func(f *osFaults) { f.installTakes = time.Minute })

		err := o.engine("v1.13.9", newMemo(), short(300*time.Millisecond, 500*time.Millisecond)).Run(context.Background())
		p := pauseOf(t, err, "TalosOS", "worker-1", "the Install call ran out its bound of 300ms", "has not ended", "an install may be pending",
			"the node stays cordoned")
		assert.NotContains(t, p.Reason, "uncordoned")
		assert.Equal(t, []string{"worker-1"}, o.f.cordonedByIchor())
		assert.Zero(t, o.state("worker-1").reboots)
	})
}

// TestTalosRaftLagUnderLoad: etcd takes 10000 writes a second and cp-3's
// status answers 300 ms after the others (a loaded node): read at their own
// moments, the healthy members differ by some 3000 entries, yet they keep
// up and the upgrade goes on. A member whose raft stalled under the same
// load is refused, named.
func TestTalosRaftLagUnderLoad(t *testing.T) {
	t.Run("healthy members read at different moments", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.raftRate = 10000
		o.setFaults("cp-3", func(f *osFaults) { f.etcdStatusDelay = 300 * time.Millisecond })

		require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
	})

	t.Run("a stalled member", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.raftRate = 10000
		o.setFaults("cp-2", func(f *osFaults) { f.etcdStalled = true })

		o.mu.Lock()
		o.machines["cp-2"].stalledAt = 5000 // stalled as the test began
		o.mu.Unlock()

		time.Sleep(20 * time.Millisecond)

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "cp-1", "member cp-2 raft index 5000 is", "it does not keep up")
		assert.Empty(t, o.upgradeNodes())
	})
}

// TestTalosEtcdQuorum: before a control plane is cordoned, every etcd
// member must answer healthy and quorum must survive its reboot.
func TestTalosEtcdQuorum(t *testing.T) {
	t.Run("a stopped member on cp-3 pauses before cp-1 is cordoned, naming cp-3; cleared, it finishes", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("cp-3", func(f *osFaults) { f.etcdStopped = true })

		memo := newMemo()
		err := o.engine("v1.13.9", memo).Run(context.Background())
		p := pauseOf(t, err, "TalosOS", "cp-1", "checks: etcd is not healthy: member cp-3 does not answer etcd status", "cp-1 is not rebooted while it is")
		assert.Contains(t, p.Action, "talosctl -n 10.0.0.13 etcd status")
		assert.Empty(t, o.upgradeNodes())
		assert.Empty(t, o.f.cordonedByIchor())

		o.setFaults("cp-3", func(f *osFaults) { f.etcdStopped = false })
		require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
	})

	t.Run("an alarm names its member", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("cp-2", func(f *osFaults) { f.etcdAlarm = "NOSPACE" })

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		p := pauseOf(t, err, "TalosOS", "cp-1", "member cp-2 alarm NOSPACE")
		assert.NotContains(t, p.Reason, "member cp-3")
		assert.Contains(t, p.Action, "talosctl -n 10.0.0.12 etcd status")
		assert.Empty(t, o.f.cordonedByIchor())
	})

	t.Run("a member far behind the leader pauses", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("cp-2", func(f *osFaults) { f.etcdLag = 4000 })

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "cp-1", "member cp-2 raft index 1000 is 4000 behind the leader's 5000")
		assert.Empty(t, o.upgradeNodes())
	})

	for _, cps := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d member(s): refused without --allow-etcd-outage, done with it", cps), func(t *testing.T) {
			o := newFakeOS(t, clusterSpec{controlPlanes: cps, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})

			err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.AllowEtcdOutage = false }).Run(context.Background())
			p := pauseOf(t, err, "TalosOS", "cp-1", fmt.Sprintf("checks: etcd has %d voting member(s), quorum %d: rebooting cp-1 leaves %d", cps, cps/2+1, cps-1),
				"etcd and the Kubernetes API stop until it is back")
			assert.Contains(t, p.Action, "--allow-etcd-outage")
			assert.Empty(t, o.upgradeNodes())
			assert.Empty(t, o.f.cordonedByIchor())

			rec := &recorder{}
			e := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.AllowEtcdOutage = true })
			e.Progress = rec
			require.NoError(t, e.Run(context.Background()))
			assert.NotEmpty(t, rec.with("TalosOS cp-1 Pending", "accepted (--allow-etcd-outage)"))
			requireTalosFinished(t, o, "v1.13.9")
		})
	}
}
