package machine_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// factoryInstaller is the Image Factory installer of the empty schematic.
const factoryInstaller = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:"

// TestInstallLogLines: machined logs a lifecycle install as the running
// Talos does: 1.13 with log.Printf (installer_image=), 1.14 with its zap
// logger (ISO time, coloured level, the fields as spaced JSON).
func TestInstallLogLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		running, image string
		start, done    *regexp.Regexp
	}{
		{
			running: "v1.13.9", image: factoryInstaller + "v1.14.1",
			start: regexp.MustCompile(`(?m)^\[talos\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d starting upgrade: installer_image=` +
				regexp.QuoteMeta(factoryInstaller+"v1.14.1") + `, disk=/dev/sda$`),
			done: regexp.MustCompile(`(?m)^\[talos\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d upgrade completed successfully: exit_code=0$`),
		},
		{
			running: "v1.14.1", image: factoryInstaller + "v1.14.2",
			start: regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \x1b\[34mINFO\x1b\[0m starting upgrade ` +
				regexp.QuoteMeta(`{"component": "machined", "service": "lifecycle", "installer_image": "`+factoryInstaller+`v1.14.2", "disk": "/dev/sda"}`) + `$`),
			done: regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \x1b\[34mINFO\x1b\[0m upgrade completed ` +
				regexp.QuoteMeta(`{"component": "machined", "service": "lifecycle", "exit_code": 0}`) + `$`),
		},
	} {
		t.Run(tc.running, func(t *testing.T) {
			t.Parallel()
			f := newMachineAt(t, false, "", tc.running)
			require.NoError(t, stageUpgrade(t.Context(), f.m, tc.image))
			log := machinedLog(t, f.m)
			assert.Regexp(t, tc.start, log)
			assert.Regexp(t, tc.done, log)
			assert.Less(t, tc.start.FindStringIndex(log)[0], tc.done.FindStringIndex(log)[0])
		})
	}
}

// TestInstallTakesOutlivesItsCaller: under installTakes an install runs that
// long; a caller that gives up first gets its deadline, while the install
// goes on, as Talos' installer container does, and ends installed, logged.
func TestInstallTakesOutlivesItsCaller(t *testing.T) {
	t.Parallel()
	f := newMachineAt(t, false, "nodes:\n  node-1:\n    installTakes: 700ms\n", "v1.13.9")
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := stageUpgrade(ctx, f.m, factoryInstaller+"v1.14.1")
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
	assert.Less(t, time.Since(start), 600*time.Millisecond, "the call ends with its caller")
	assert.Empty(t, f.m.State().StagedVersion, "still installing")
	assert.NotContains(t, machinedLog(t, f.m), "upgrade completed")

	err = stageUpgrade(t.Context(), f.m, factoryInstaller+"v1.14.1")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "one install at a time: %v", err)

	s := waitState(t, f.m, "installed", func(s simmachine.State) bool { return s.StagedVersion == "v1.14.1" })
	assert.Equal(t, factoryInstaller+"v1.14.1", s.InstallerImage)
	assert.Eventually(t, func() bool { return strings.Contains(machinedLog(t, f.m), "upgrade completed successfully") },
		5*time.Second, 10*time.Millisecond)
}

// TestRollback: with an install staged, a rollback drops it and reboots
// into the running version; without one it boots the previous version;
// with no previous one Talos refuses.
func TestRollback(t *testing.T) {
	t.Parallel()
	f := newMachineAt(t, false, "", "v1.13.9")
	err := f.m.Rollback()
	assert.Equal(t, codes.Unknown, status.Code(err))
	assert.ErrorContains(t, err, "label does not exist")

	before := f.m.State()
	require.NoError(t, stageUpgrade(t.Context(), f.m, factoryInstaller+"v1.14.0"))
	require.NoError(t, f.m.Rollback())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, "v1.13.9", after.TalosVersion, "back on the running version")
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Empty(t, after.StagedVersion, "the staged install dropped")
	assert.Contains(t, machinedLog(t, f.m), "machined logger initialized")

	require.NoError(t, stageUpgrade(t.Context(), f.m, factoryInstaller+"v1.14.1"))
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	on114 := waitState(t, f.m, "on v1.14.1", func(s simmachine.State) bool { return s.Up && s.TalosVersion == "v1.14.1" })
	assert.Equal(t, "v1.13.9", on114.PreviousVersion)

	require.NoError(t, f.m.Rollback())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	back := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, "v1.13.9", back.TalosVersion, "rolled back to the previous slot")
}

// stageUpgrade pulls image into the machine's system store, as a client does
// first (talosctl upgrade, ichor), then stages it with LifecycleService's
// install under ctx.
func stageUpgrade(ctx context.Context, m *simmachine.Machine, image string) error {
	if _, err := m.Pull(context.WithoutCancel(ctx), simmachine.NamespaceSystem, image); err != nil {
		return err
	}
	return m.StageUpgrade(ctx, simmachine.NamespaceSystem, image, nil)
}

// TestInstallAbandonedBeforeItsInstallerIsNoInstall: a caller gone while the
// installer container is being created (the call's context) leaves nothing
// installed, machined logging the failure, and the events show no install;
// the next call installs, one install (soak seed 2096 counted the abandoned
// attempt as a second install of the node).
func TestInstallAbandonedBeforeItsInstallerIsNoInstall(t *testing.T) {
	t.Parallel()
	f := newMachineAt(t, false, "", "v1.13.9")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := stageUpgrade(ctx, f.m, factoryInstaller+"v1.14.1")
	assert.Equal(t, codes.Canceled, status.Code(err), "%v", err)
	assert.Empty(t, f.m.State().StagedVersion, "nothing installed")
	assert.Contains(t, machinedLog(t, f.m), "upgrade failed")
	assert.Empty(t, installEvents(t, f.events))

	require.NoError(t, stageUpgrade(t.Context(), f.m, factoryInstaller+"v1.14.1"))
	assert.Equal(t, []string{"v1.14.1"}, installEvents(t, f.events), "one install")
}
