package talos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseInstallEvidence reads machined logs as Talos 1.12's
// MachineService.Upgrade, 1.13 (log.Printf) and 1.14 (structured) write them.
func TestParseInstallEvidence(t *testing.T) {
	const (
		boot    = "[talos] 2026/11/30 10:00:00 machined logger initialized\n"
		request = "[talos] 2026/11/30 10:01:00 upgrade request received: staged false, force false, reboot mode DEFAULT\n" +
			"[talos] 2026/11/30 10:01:00 validating \"ghcr.io/siderolabs/installer:v1.13.9\"\n"
		sequence = "[talos] 2026/11/30 10:01:02 upgrade sequence: 13 phase(s)\n" +
			"[talos] 2026/11/30 10:01:02 phase drain (1/13): 1 tasks(s)\n"
		installed = "[talos] task upgrade (9/13): 2026/11/30 10:01:30 performing upgrade via \"ghcr.io/siderolabs/installer:v1.13.9\"\n" +
			"[talos] task upgrade (9/13): 2026/11/30 10:01:40 upgrade successful\n"
	)

	const (
		factory = "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1"
		// Talos 1.14's lines, as its zap console encoder writes them.
		start114 = "2026-11-30T10:01:00.000Z \x1b[34mINFO\x1b[0m starting upgrade {\"component\": \"machined\", \"service\": \"lifecycle\", " +
			"\"installer_image\": \"" + factory + "\", \"disk\": \"/dev/sda\"}\n"
		done114   = "2026-11-30T10:01:40.000Z \x1b[34mINFO\x1b[0m upgrade completed {\"component\": \"machined\", \"service\": \"lifecycle\", \"exit_code\": 0}\n"
		failed114 = "2026-11-30T10:01:40.000Z \x1b[33mWARN\x1b[0m upgrade failed {\"component\": \"machined\", \"service\": \"lifecycle\", \"exit_code\": 1}\n"
	)

	for _, tc := range []struct {
		name  string
		log   string
		want  InstallState
		image string
	}{
		{"the boot's whole log, no install", boot + "[talos] service[kubelet](Running): Health check successful\n", InstallNone, ""},
		{"rolled over, no install", "[talos] service[kubelet](Running): Health check successful\n", InstallUnknown, ""},
		{"1.13 started", boot + "[talos] 2026/11/30 10:01:00 starting upgrade: installer_image=ghcr.io/siderolabs/installer:v1.14.1, disk=/dev/sda\n", InstallRunning,
			"ghcr.io/siderolabs/installer:v1.14.1"},
		{
			"1.13 completed", boot + "[talos] 2026/11/30 10:01:00 starting upgrade: installer_image=ghcr.io/siderolabs/installer:v1.14.1, disk=/dev/sda\n" +
				"[talos] 2026/11/30 10:01:30 upgrade completed successfully: exit_code=0\n", InstallDone, "ghcr.io/siderolabs/installer:v1.14.1",
		},
		{
			"1.13 failed", boot + "[talos] starting upgrade: installer_image=x:v1.14.1, disk=/dev/sda\n[talos] upgrade failed: exit_code=1\n", InstallFailed, "x:v1.14.1",
		},
		{
			"1.14 completed, rolled over before the boot's start",
			`[talos] starting upgrade {"component": "lifecycle", "installer_image": "x:v1.14.1", "disk": "/dev/sda"}` + "\n" +
				`[talos] upgrade completed {"component": "lifecycle", "exit_code": 0}` + "\n", InstallDone, "x:v1.14.1",
		},
		{"1.14 started", boot + start114, InstallRunning, factory},
		{"1.14 completed", boot + start114 + done114, InstallDone, factory},
		{"1.14 failed", boot + start114 + failed114, InstallFailed, factory},
		{"1.14 completed, its start rolled out", done114, InstallDone, ""},
		{
			"another install after a completed one", boot + start114 + done114 +
				"[talos] 2026/11/30 10:05:00 starting upgrade: installer_image=ghcr.io/siderolabs/installer:v1.13.9, disk=/dev/sda\n" +
				"[talos] 2026/11/30 10:05:30 upgrade completed successfully: exit_code=0\n", InstallDone, "ghcr.io/siderolabs/installer:v1.13.9",
		},
		{
			"failed, then started again", boot + "[talos] starting upgrade: a\n[talos] upgrade failed: exit_code=1\n[talos] starting upgrade: b\n", InstallRunning, "",
		},
		{"1.12 request, its checks under way", boot + request, InstallNone, ""},
		{"1.12 sequence started", boot + request + sequence, InstallSequence, "ghcr.io/siderolabs/installer:v1.13.9"},
		{"1.12 sequence installed, its reboot to come", boot + request + sequence + installed, InstallSequence, "ghcr.io/siderolabs/installer:v1.13.9"},
		{
			"1.12 sequence, a second request locked out", boot + request + sequence + installed + request + "[talos] 2026/11/30 10:01:50 upgrade failed: locked\n",
			InstallSequence, "ghcr.io/siderolabs/installer:v1.13.9",
		},
		{"1.12 locked out alone", boot + request + "[talos] upgrade failed: locked\n", InstallNone, ""},
		{"1.12 staged", boot + request + "[talos] stageUpgrade sequence: 5 phase(s)\n", InstallSequence, "ghcr.io/siderolabs/installer:v1.13.9"},
		{
			"1.12 sequence failed", boot + request + sequence + "[talos] task upgrade (9/13): performing upgrade via \"x\"\n" +
				"[talos] phase upgrade (9/13): failed\n[talos] upgrade sequence: failed\n[talos] upgrade failed: error running phase 9 in upgrade sequence: exit status 1\n", InstallFailed, "x",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseInstallEvidence(strings.NewReader(tc.log))
			require.NoError(t, err)
			assert.Equal(t, tc.want.String(), got.State.String())
			assert.Equal(t, tc.image, got.Image, "the installer image logged")
		})
	}
}
