package engine

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

const testSchematic = "5a8a2c5d1c6e3b4f7a9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"

// A worker moved to a factory schematic whose config still names the plain
// installer is upgraded with the factory installer of its schematic; the
// others with their configured installer.
func TestTalosUpgradeKeepsTheSchematic(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.machine("worker-1").runs = talos.Installed{Platform: "metal", Extensions: []talos.Extension{
		{Name: "iscsi-tools", Version: "v0.2.0"},
		{Name: "schematic", Version: testSchematic, Author: "Image Factory (https://factory.talos.dev)"},
	}}

	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")

	o.mu.Lock()
	upgrades := slices.Clone(o.upgrades)
	o.mu.Unlock()

	assert.Contains(t, upgrades, "worker-1 factory.talos.dev/metal-installer/"+testSchematic+":v1.13.9")
	assert.Contains(t, upgrades, "worker-2 "+installerOf(t, o, "worker-2", "v1.13.9"))
}

// The stage's start reads every node's installer at once, not one node
// after another: the barrier lets the nodes' first Installed calls go only
// when all five are in flight together (a read one after another waits out
// its limit at every node).
func TestTalosStartReadsTheNodesAtOnce(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.installedBarrier = newCallBarrier(len(o.machines), 2*time.Second)

	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")

	assert.Zero(t, o.installedBarrier.gaveUpOn(), "Installed calls that waited for the others in vain")
}

// A node with extensions but no schematic is refused before anything
// changes, with the node, the reason and the flag to pass.
func TestTalosUpgradeRefusesExtensionsWithoutSchematic(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.machine("worker-2").runs = talos.Installed{Platform: "metal", Extensions: []talos.Extension{{Name: "nvidia-open-gpu-kernel-modules", Version: "570.148.08"}}}

	err := o.engine("v1.13.9", newMemo()).Run(context.Background())
	requirePause(t, err, "TalosOS", "worker-2",
		`checks: installer: node "worker-2" runs system extensions (nvidia-open-gpu-kernel-modules) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --installer-image worker-2=REPOSITORY:v1.13.9`)
	assert.Empty(t, o.upgradeNodes())
	assert.Empty(t, o.f.cordonedByIchor())

	var pause *PauseError
	require.ErrorAs(t, err, &pause)
	assert.Equal(t, "kubectl ichor abort, then kubectl ichor upgrade talos --to v1.13.9 --installer-image worker-2=<installer that keeps what it runs>:v1.13.9", pause.Action)
}

// empty114 is Talos 1.14.1's default installer on metal.
const empty114 = "factory.talos.dev/metal-installer/" + stages.EmptySchematic + ":v1.14.1"

// spec113 is a 3+2 cluster on Talos v1.13.9 whose configs name the generic
// installer (what talosctl gen config 1.13 wrote).
func spec113() clusterSpec {
	return clusterSpec{controlPlanes: 3, workers: 2, kubernetes: "v1.35.4", talos: "v1.13.9", workloads: 1}
}

// Vanilla nodes go to Talos 1.14 with the factory installer of the empty
// schematic, the one that exists, and come back on it.
func TestTalosUpgradeTo114UsesTheFactoryInstaller(t *testing.T) {
	o := newFakeOS(t, spec113())

	require.NoError(t, o.engine("v1.14.1", newMemo(), func(opts *Options) { opts.MaxUnavailable = 2 }).Run(context.Background()))
	requireTalosFinished(t, o, "v1.14.1")

	o.mu.Lock()
	upgrades := slices.Clone(o.upgrades)
	o.mu.Unlock()

	for _, u := range upgrades {
		assert.True(t, strings.HasSuffix(u, " "+empty114), u)
	}
}

// Every installer of a batch is pulled on its node before the batch's first
// cordon; a pull that fails pauses with nothing of the batch cordoned or
// drained, naming the node, the image and the flag.
func TestTalosPrePullBeforeCordon(t *testing.T) {
	t.Run("every installer pulled before the batch's cordon", func(t *testing.T) {
		o := newFakeOS(t, spec113())

		var (
			mu     sync.Mutex
			pulled = map[string]bool{}
			early  []string
		)

		o.f.onPull = func(node, ref string) {
			mu.Lock()
			defer mu.Unlock()

			pulled[node+" "+ref] = true

			for _, c := range o.f.cordonedByIchor() {
				if strings.HasPrefix(c, "worker") && strings.HasPrefix(node, "worker") {
					early = append(early, node+" pulled while "+c+" was cordoned")
				}
			}
		}

		require.NoError(t, o.engine("v1.14.1", newMemo(), func(opts *Options) { opts.MaxUnavailable = 2 }).Run(context.Background()))

		assert.Empty(t, early, "the batch's pulls all came before its first cordon")

		o.mu.Lock()
		upgrades := slices.Clone(o.upgrades)
		o.mu.Unlock()

		require.Len(t, upgrades, 5)

		mu.Lock()
		defer mu.Unlock()

		for _, u := range upgrades {
			assert.True(t, pulled[u], "%s: its installer was pulled on it first", u)
		}
	})

	t.Run("the batch's installers pull at most --pull-concurrency nodes at once", func(t *testing.T) {
		o := newFakeOS(t, spec113())
		o.f.machine("worker-1").faults.pullDelay = 100 * time.Millisecond
		o.f.machine("worker-2").faults.pullDelay = 100 * time.Millisecond

		require.NoError(t, o.engine("v1.14.1", newMemo(), func(opts *Options) {
			opts.MaxUnavailable = 2
			opts.PullConcurrency = 1
		}).Run(context.Background()))

		o.f.mu.Lock()
		defer o.f.mu.Unlock()

		assert.Equal(t, 1, o.f.pullingMax, "the two workers of one batch pulled one after the other")
	})

	t.Run("a pull that fails pauses with nothing cordoned", func(t *testing.T) {
		o := newFakeOS(t, spec113())
		o.f.machine("worker-2").faults.pullFails = true

		var (
			mu             sync.Mutex
			cordonedAtPull []string
		)

		// The workers' installers are pulled ahead while cp-3 is upgraded, and again
		// at their batch's turn: no worker is cordoned at either.
		o.f.onPull = func(node, _ string) {
			if strings.HasPrefix(node, "worker") {
				mu.Lock()
				defer mu.Unlock()

				for _, c := range o.f.cordonedByIchor() {
					if strings.HasPrefix(c, "worker") {
						cordonedAtPull = append(cordonedAtPull, c)
					}
				}
			}
		}

		err := o.engine("v1.14.1", newMemo(), func(opts *Options) { opts.MaxUnavailable = 2 }).Run(context.Background())
		pause := pauseOf(t, err, "TalosOS", "worker-2", "pre-pull:", `node "worker-2": pull its installer `+empty114, "not found", "nothing was cordoned or drained")
		assert.Contains(t, pause.Action, "talosctl -n "+o.f.machine("worker-2").ip+" image pull "+empty114)
		assert.Contains(t, pause.Action, "--installer-image worker-2=")

		assert.Equal(t, []string{"cp-1", "cp-2", "cp-3"}, o.upgradeNodes(), "the control planes before; no worker installed")
		assert.Empty(t, o.f.cordonedByIchor(), "nothing left cordoned")
		assert.Empty(t, cordonedAtPull, "no worker cordoned while the batch pulled")

		o.f.mu.Lock()
		defer o.f.mu.Unlock()

		for _, ev := range o.f.evictions {
			assert.False(t, strings.HasPrefix(ev, "worker"), "a worker drained: %s", ev)
		}
	})

	t.Run("the next group's installers are pulled while the group before it is upgraded", func(t *testing.T) {
		o := newFakeOS(t, spec113())

		var (
			mu         sync.Mutex
			pulls      = map[string]int{}
			workerPull = make(chan struct{})
			once       sync.Once
			late       bool
		)

		o.f.onPull = func(node, _ string) {
			mu.Lock()
			pulls[node]++
			mu.Unlock()

			if strings.HasPrefix(node, "worker") {
				once.Do(func() { close(workerPull) })
			}
		}

		// cp-3's install waits for a worker's pull: it goes on at once only if the
		// workers pull beside cp-3's upgrade, not after it.
		o.onUpgrade = func(_ context.Context, node string) (bool, error) {
			if node == "cp-3" {
				select {
				case <-workerPull:
				case <-time.After(10 * time.Second):
					late = true
				}
			}

			return false, nil
		}

		require.NoError(t, o.engine("v1.14.1", newMemo(), func(opts *Options) { opts.MaxUnavailable = 2 }).Run(context.Background()))
		requireTalosFinished(t, o, "v1.14.1")

		mu.Lock()
		defer mu.Unlock()

		assert.False(t, late, "the workers' installers were pulled while cp-3 was upgraded")
		assert.Equal(t, map[string]int{"cp-1": 1, "cp-2": 1, "cp-3": 1, "worker-1": 1, "worker-2": 1}, pulls,
			"each installer pulled once: a group's own pre-pull does not pull what was pulled ahead")
	})

	t.Run("a Talos that cannot pre-pull is said and upgraded: its Upgrade call checks the image", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.f.machine("worker-1").faults.pullUnsup = true
		o.setFaults("worker-1", func(f *osFaults) { f.legacy = true })

		rec := &recorder{}
		e := o.engine("v1.13.9", newMemo())
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		requireTalosFinished(t, o, "v1.13.9")
		assert.NotEmpty(t, rec.with("TalosOS worker-1 Pending: its Talos cannot pre-pull", "its Upgrade call pulls and checks"))
	})
}

// An explicit installer that does not carry a node's schematic is refused
// before anything changes, unless --drop-extensions names the node.
func TestTalosExplicitInstallerKeepsExtensions(t *testing.T) {
	withSchematic := talos.Installed{Platform: "metal", Extensions: []talos.Extension{
		{Name: "iscsi-tools", Version: "v0.2.0"},
		{Name: "schematic", Version: testSchematic, Author: "Image Factory (https://factory.talos.dev)"},
	}}
	plain := stages.InstallerFlags{Image: "ghcr.io/siderolabs/installer:v1.13.9"}

	o := newFakeOS(t, talosSpec())
	o.machine("worker-1").runs = withSchematic

	err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.Installers = plain }).Run(context.Background())
	pause := pauseOf(t, err, "TalosOS", "worker-1",
		`node "worker-1" runs schematic 5a8a2c5d1c6e, iscsi-tools, which --installer-image ghcr.io/siderolabs/installer:v1.13.9 does not carry`)
	assert.Contains(t, pause.Reason, "--drop-extensions worker-1")
	assert.Empty(t, o.upgradeNodes(), "nothing changed")
	assert.Empty(t, o.f.cordonedByIchor())

	o = newFakeOS(t, talosSpec())
	o.machine("worker-1").runs = withSchematic
	plain.DropExtensions = []string{"worker-1"}

	require.NoError(t, o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.Installers = plain }).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
	assert.Empty(t, o.state("worker-1").runs.Extensions, "dropped, as the operator accepted")
}

// After its reboot a node is compared with what its installer was to carry:
// one that came back without an extension pauses, cordoned, naming it.
func TestTalosRebootWithoutExtensionsPauses(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	// An installer built with imager for a node that runs an extension
	// without a schematic cannot be judged before the reboot; this one does
	// not carry it.
	o.machine("worker-2").runs = talos.Installed{Platform: "metal", Extensions: []talos.Extension{{Name: "nvidia-open-gpu-kernel-modules", Version: "570.148.08"}}}
	custom := stages.InstallerFlags{Nodes: map[string]string{"worker-2": "registry.local/talos/gpu-installer:v1.13.9"}}
	memo := newMemo()

	err := o.engine("v1.13.9", memo, func(opts *Options) { opts.Installers = custom }).Run(context.Background())
	pause := pauseOf(t, err, "TalosOS", "worker-2",
		`node "worker-2" came back on Talos v1.13.9 without what its installer was to carry: nvidia-open-gpu-kernel-modules`, "the node stays cordoned")
	assert.Contains(t, pause.Action, "get extensions")
	assert.Equal(t, "v1.13.9", o.state("worker-2").version, "it rebooted into the target")
	assert.Equal(t, []string{"worker-2"}, o.f.cordonedByIchor(), "cordoned")

	// A resume verifies it again: still missing, still paused.
	err = o.engine("v1.13.9", memo, func(opts *Options) { opts.Installers = custom }).Run(context.Background())
	requirePause(t, err, "TalosOS", "worker-2", "nvidia-open-gpu-kernel-modules")
	assert.Equal(t, []string{"worker-2"}, o.f.cordonedByIchor())

	// Installed again with one that carries it, the resume finishes it.
	o.mu.Lock()
	o.machines["worker-2"].runs.Extensions = []talos.Extension{{Name: "nvidia-open-gpu-kernel-modules", Version: "570.148.08"}}
	o.mu.Unlock()
	require.NoError(t, o.engine("v1.13.9", memo, func(opts *Options) { opts.Installers = custom }).Run(context.Background()))
	assert.Empty(t, o.f.cordonedByIchor())
}
