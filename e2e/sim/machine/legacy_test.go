package machine_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

const installer1139 = "ghcr.io/siderolabs/installer:v1.13.9"

// installEvents are the machine's talos-install events, by version.
func installEvents(t *testing.T, path string) []string {
	t.Helper()
	evs, err := events.Read(path)
	require.NoError(t, err)
	var out []string
	for _, e := range evs {
		if e.Component == events.TalosInstall {
			out = append(out, e.Version)
		}
	}
	return out
}

func machinedLog(t *testing.T, m *simmachine.Machine) string {
	t.Helper()
	b, err := m.MachinedLog()
	require.NoError(t, err)
	return string(b)
}

func TestServesByVersion(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	// v1.12.4: MachineService only.
	assert.False(t, f.m.Serves("machine.LifecycleService"))
	assert.False(t, f.m.Serves("machine.ImageService"))
	assert.True(t, f.m.Serves("machine.MachineService"))
	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139}, nil))
	waitState(t, f.m, "on v1.13.9", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.13.9" })
	assert.True(t, f.m.Serves("machine.LifecycleService"), "Talos 1.13 brought it")
	assert.True(t, f.m.Serves("machine.ImageService"), "Talos 1.13 brought it")
}

func TestLegacyUpgradeDrainsInstallsAndReboots(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	before := f.m.State()
	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139}, nil))
	select {
	case <-f.drained:
	case <-time.After(5 * time.Second):
		t.Fatal("BeforeReboot not called")
	}
	after := waitState(t, f.m, "new version", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.13.9" })
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Equal(t, installer1139, after.InstallerImage)
	assert.Equal(t, []string{"v1.13.9"}, installEvents(t, f.events))
}

func TestLegacyUpgradeChecksInTheCall(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		controlPlane bool
		faults       string
		req          *machineapi.UpgradeRequest
		etcd         error
		want         string
	}{
		{name: "no version tag", req: &machineapi.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:latest"},
			want: `error validating installer image "ghcr.io/siderolabs/installer:latest"`},
		{name: "the pull fails", faults: "nodes:\n  node-1:\n    pullFails: true\n", req: &machineapi.UpgradeRequest{Image: installer1139},
			want: "error validating installer image \"" + installer1139 + "\": failed to pull image \"" + installer1139 + "\": failed to resolve reference"},
		{name: "etcd unhealthy on a control plane", controlPlane: true, req: &machineapi.UpgradeRequest{Image: installer1139},
			etcd: errors.New("etcd member 1 is not healthy"), want: "error validating etcd for upgrade: etcd member 1 is not healthy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newMachine(t, tc.controlPlane, tc.faults)
			err := f.m.Upgrade(t.Context(), tc.req, func(context.Context) error { return tc.etcd })
			require.Error(t, err)
			assert.Equal(t, codes.Unknown, status.Code(err))
			assert.Contains(t, err.Error(), tc.want)
			time.Sleep(300 * time.Millisecond) // a sequence, had one started, would have rebooted by now
			assert.Equal(t, "v1.12.4", f.m.State().TalosVersion)
			assert.Empty(t, installEvents(t, f.events), "nothing installed")
			assert.Contains(t, machinedLog(t, f.m), "upgrade request received: staged false, force false, reboot mode DEFAULT")
		})
	}
}

func TestLegacyUpgradeForceSkipsEtcd(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	called := false
	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139, Force: true},
		func(context.Context) error { called = true; return errors.New("unhealthy") }))
	waitState(t, f.m, "new version", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.13.9" })
	assert.False(t, called, "force skips Talos' etcd checks")
}

// A second call while the first sequence runs gets its ack; its sequence
// fails on the lock, in the background: one install.
func TestLegacyUpgradeLockedWhileOneRuns(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "nodes:\n  node-1:\n    installHangs: true\n")
	before := f.m.State()
	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139}, nil))
	require.Eventually(t, func() bool { return strings.Contains(machinedLog(t, f.m), "upgrade successful") },
		5*time.Second, 10*time.Millisecond, "the install done")
	// installHangs: the sequence holds after its install, in the same boot.
	time.Sleep(300 * time.Millisecond)
	st := f.m.State()
	assert.True(t, st.Up)
	assert.Equal(t, before.BootID, st.BootID)
	assert.Equal(t, "v1.13.9", st.StagedVersion)

	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139}, nil))
	assert.Contains(t, machinedLog(t, f.m), "upgrade failed: locked")

	require.NoError(t, os.WriteFile(f.faults, []byte("nodes: {}\n"), 0o644))
	after := waitState(t, f.m, "new version", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.13.9" })
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Equal(t, []string{"v1.13.9"}, installEvents(t, f.events), "one install")
	// The boot's event is logged as the machine comes up, not before its state says so.
	assert.Eventually(t, func() bool { return slices.Equal([]string{"v1.12.4", "v1.13.9"}, talosEvents(t, f.events)) },
		5*time.Second, 10*time.Millisecond, "a boot event per version: %v", talosEvents(t, f.events))
}

func TestLegacyStagedUpgradeRebootsWithoutDrain(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	before := f.m.State()
	require.NoError(t, f.m.Upgrade(t.Context(), &machineapi.UpgradeRequest{Image: installer1139, Stage: true}, nil))
	after := waitState(t, f.m, "new version", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.13.9" })
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Equal(t, []string{"v1.13.9"}, installEvents(t, f.events))
	select {
	case <-f.drained:
		t.Fatal("a staged upgrade does not drain")
	default:
	}
}
