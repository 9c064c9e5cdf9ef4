package talos

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseInstallEvidence reads machined logs as Talos 1.13 (log.Printf)
// and 1.14 (structured) write them.
func TestParseInstallEvidence(t *testing.T) {
	const boot = "[talos] 2026/11/30 10:00:00 machined logger initialized\n"

	for _, tc := range []struct {
		name string
		log  string
		want InstallState
	}{
		{"the boot's whole log, no install", boot + "[talos] service[kubelet](Running): Health check successful\n", InstallNone},
		{"rolled over, no install", "[talos] service[kubelet](Running): Health check successful\n", InstallUnknown},
		{"1.13 started", boot + "[talos] 2026/11/30 10:01:00 starting upgrade: installer_image=ghcr.io/siderolabs/installer:v1.14.1, disk=/dev/sda\n", InstallRunning},
		{
			"1.13 completed", boot + "[talos] 2026/11/30 10:01:00 starting upgrade: installer_image=ghcr.io/siderolabs/installer:v1.14.1, disk=/dev/sda\n" +
				"[talos] 2026/11/30 10:01:30 upgrade completed successfully: exit_code=0\n", InstallDone,
		},
		{
			"1.13 failed", boot + "[talos] starting upgrade: installer_image=x:v1.14.1, disk=/dev/sda\n[talos] upgrade failed: exit_code=1\n", InstallFailed,
		},
		{
			"1.14 completed, rolled over before the boot's start",
			`[talos] starting upgrade {"component": "lifecycle", "installer_image": "x:v1.14.1", "disk": "/dev/sda"}` + "\n" +
				`[talos] upgrade completed {"component": "lifecycle", "exit_code": 0}` + "\n", InstallDone,
		},
		{
			"failed, then started again", boot + "[talos] starting upgrade: a\n[talos] upgrade failed: exit_code=1\n[talos] starting upgrade: b\n", InstallRunning,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseInstallEvidence(strings.NewReader(tc.log))
			require.NoError(t, err)
			assert.Equal(t, tc.want.String(), got.String())
		})
	}
}
