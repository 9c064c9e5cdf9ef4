package stages

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

// A node with extensions but no schematic is refused before anything
// changes, with the node, the reason and the flag to pass.
func TestTalosUpgradeRefusesExtensionsWithoutSchematic(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.machine("worker-2").runs = talos.Installed{Platform: "metal", Extensions: []talos.Extension{{Name: "nvidia-open-gpu-kernel-modules", Version: "570.148.08"}}}

	err := o.engine("v1.13.9", newMemo()).Run(context.Background())
	requirePause(t, err, "TalosOS", "worker-2",
		`checks: installer: node "worker-2" runs system extensions (nvidia-open-gpu-kernel-modules) but no Image Factory schematic: the installer that keeps them cannot be derived: pass it with --image REPOSITORY:v1.13.9`)
	assert.Empty(t, o.upgradeNodes())
	assert.Empty(t, o.f.cordonedByIchor())

	var pause *PauseError
	require.ErrorAs(t, err, &pause)
	assert.Equal(t, "kubectl ichor abort, then kubectl ichor upgrade talos --to v1.13.9 --image <installer that keeps the node's extensions>:v1.13.9", pause.Action)
}
