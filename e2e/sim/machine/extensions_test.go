package machine_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

const simSchematic = "5a8a2c5d1c6e3b4f7a9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d"

// emptySchematic is Image Factory's empty schematic, whose installer is
// Talos 1.14's default.
const emptySchematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

// extensionNames lists the machine's ExtensionStatus resources as talosctl
// get extensions shows them: "ID name version".
func extensionNames(t *testing.T, m *simmachine.Machine) []string {
	t.Helper()
	list, err := safe.StateListAll[*runtime.ExtensionStatus](t.Context(), m.COSI())
	require.NoError(t, err)
	var out []string
	for r := range list.All() {
		out = append(out, r.Metadata().ID()+" "+r.TypedSpec().Metadata.Name+" "+r.TypedSpec().Metadata.Version)
	}
	return out
}

func newExtensionsMachine(t *testing.T, version string) *simmachine.Machine {
	t.Helper()
	m, err := simmachine.New(simmachine.Options{
		Name: "node-1", IP: netip.MustParseAddr("127.0.0.11"), TalosVersion: version,
		Config: bytesOf(t, genConfig(t, machine.TypeWorker)),
		Extensions: []simmachine.Extension{
			{Name: "iscsi-tools", Version: "v0.2.0", Author: "Sidero Labs"},
			{Name: "schematic", Version: simSchematic, Author: "Image Factory (https://factory.talos.dev)"},
		},
		RebootDelay: 50 * time.Millisecond, PullLatency: time.Millisecond, HealthCheckDelay: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	return m
}

// upgradeWith stages an upgrade with image and reboots into it.
func upgradeWith(t *testing.T, m *simmachine.Machine, image string) {
	t.Helper()
	boot := m.State().BootID
	_, err := m.Pull(t.Context(), simmachine.NamespaceSystem, image)
	require.NoError(t, err)
	require.NoError(t, m.StageUpgrade(t.Context(), simmachine.NamespaceSystem, image, nil))
	require.NoError(t, m.Reboot())
	waitState(t, m, "up on a new boot", func(s simmachine.State) bool { return s.Up && s.BootID != boot })
}

func TestExtensionsServedAsTalosServesThem(t *testing.T) {
	t.Parallel()
	m := newExtensionsMachine(t, "v1.13.9")
	assert.Equal(t, []string{"0 iscsi-tools v0.2.0", "1 schematic " + simSchematic}, extensionNames(t, m))

	sec, err := safe.StateGetByID[*runtime.SecurityState](t.Context(), m.COSI(), runtime.SecurityStateID)
	require.NoError(t, err)
	assert.False(t, sec.TypedSpec().SecureBoot)

	// Talos 1.14 also surfaces the schematic as its own resource.
	upgradeWith(t, m, "factory.talos.dev/metal-installer/"+simSchematic+":v1.14.1")
	s, err := safe.StateGetByID[*runtime.ImageFactorySchematic](t.Context(), m.COSI(), runtime.ImageFactorySchematicID)
	require.NoError(t, err)
	assert.Equal(t, simSchematic, s.TypedSpec().SchematicID)
	assert.Equal(t, "https://factory.talos.dev", s.TypedSpec().APIURL)
}

func TestUpgradeExtensionsFollowTheInstaller(t *testing.T) {
	t.Parallel()

	// The factory installer of the node's schematic keeps its extensions.
	m := newExtensionsMachine(t, "v1.12.4")
	upgradeWith(t, m, "factory.talos.dev/metal-installer/"+simSchematic+":v1.13.9")
	assert.Equal(t, "v1.13.9", m.State().TalosVersion)
	assert.Equal(t, []string{"0 iscsi-tools v0.2.0", "1 schematic " + simSchematic}, extensionNames(t, m))

	// The plain installer drops them all (a 1.13 one: 1.14 has none).
	upgradeWith(t, m, "ghcr.io/siderolabs/installer:v1.13.9")
	assert.Equal(t, "v1.13.9", m.State().TalosVersion)
	assert.Empty(t, extensionNames(t, m))

	// The installer of another schematic carries that schematic, signed by
	// the factory it comes from.
	upgradeWith(t, m, "factory.talos.dev/metal-installer/"+emptySchematic+":v1.14.1")
	assert.Equal(t, []string{"0 schematic " + emptySchematic}, extensionNames(t, m))
	assert.Equal(t, []simmachine.Extension{{Name: "schematic", Version: emptySchematic, Author: "Image Factory (https://factory.talos.dev)"}}, m.State().Extensions)
}

// TestSecurityStateSaysTheBootLoader: a machine booted with GRUB says bootedWithUKI
// false, one booted from a UKI with systemd-boot true, as Talos' SecurityState does.
func TestSecurityStateSaysTheBootLoader(t *testing.T) {
	t.Parallel()
	for _, uki := range []bool{false, true} {
		m, err := simmachine.New(simmachine.Options{
			Name: "node-1", IP: netip.MustParseAddr("127.0.0.11"), TalosVersion: "v1.13.9",
			Config: bytesOf(t, genConfig(t, machine.TypeWorker)), BootedWithUKI: uki,
			RebootDelay: 50 * time.Millisecond, PullLatency: time.Millisecond, HealthCheckDelay: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		t.Cleanup(m.Close)
		sec, err := safe.StateGetByID[*runtime.SecurityState](t.Context(), m.COSI(), runtime.SecurityStateID)
		require.NoError(t, err)
		assert.Equal(t, uki, sec.TypedSpec().BootedWithUKI)
	}
}
