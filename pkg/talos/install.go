package talos

import (
	"bufio"
	"context"
	"errors"
	"io"
	"regexp"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
)

// Install installs a node's Talos from the installer image without
// rebooting it: it pulls the image and runs LifecycleService.Upgrade to its
// end (a non-zero exit code is an error). The new version boots on the next
// reboot (Reboot). On a Talos without the lifecycle service (before 1.13) it
// falls back to the deprecated MachineService.Upgrade, which installs and
// reboots by itself: rebooting is then true and no Reboot is needed.
func (c *Client) Install(ctx context.Context, node, image string) (rebooting bool, err error) {
	nodeCtx := client.WithNode(ctx, node)

	name, err := c.pull(ctx, node, NamespaceSystem, image)

	switch {
	case IsUnimplemented(err):
		return true, c.legacyUpgrade(nodeCtx, node, image)
	case err != nil:
		return false, nodeErr(node, "upgrade: pull "+image, err)
	}

	err = c.lifecycleUpgrade(nodeCtx, name)

	switch {
	case IsUnimplemented(err):
		return true, c.legacyUpgrade(nodeCtx, node, image)
	case err != nil:
		return false, nodeErr(node, "upgrade to "+image, err)
	}

	return false, nil
}

// Reboot asks a node to reboot; it returns once the reboot is accepted.
func (c *Client) Reboot(ctx context.Context, node string) error {
	return nodeErr(node, "reboot", c.c.Reboot(client.WithNode(ctx, node)))
}

// IsInstallInProgress reports whether err is Talos refusing an upgrade
// because another installation or upgrade runs on the node right now
// (LifecycleService's lock).
func IsInstallInProgress(err error) bool {
	return err != nil && client.StatusCode(err) == codes.FailedPrecondition &&
		strings.Contains(client.Status(err).Message(), "already in progress")
}

// InstallState is what a node's machined log says of the installs of its
// current boot.
type InstallState int

const (
	// InstallUnknown: the log no longer reaches back to the boot's start
	// and holds no install: one may have run before what it keeps.
	InstallUnknown InstallState = iota
	// InstallNone: no install was started in this boot.
	InstallNone
	// InstallRunning: the last install started and has not ended (it runs,
	// or its caller went away mid-way).
	InstallRunning
	// InstallFailed: the last install ended with a non-zero exit code.
	InstallFailed
	// InstallDone: the last install ended with exit code 0: the new version
	// is installed and boots on the next reboot.
	InstallDone
	// InstallSequence: an upgrade sequence of MachineService.Upgrade (the
	// call of a Talos before 1.13) started and has not failed: it drains,
	// installs and reboots the node by itself.
	InstallSequence
)

func (s InstallState) String() string {
	switch s {
	case InstallNone:
		return "no install in this boot"
	case InstallRunning:
		return "an install started and not ended"
	case InstallFailed:
		return "the last install failed"
	case InstallDone:
		return "installed, waiting for a reboot"
	case InstallSequence:
		return "an upgrade sequence runs: the node installs and reboots by itself"
	default:
		return "unknown (machined's log no longer reaches back to the boot)"
	}
}

// Install evidence in machined's log. Talos does not expose a staged upgrade
// as a resource (the installer writes META's upgrade tag to the partition;
// machined reloads it only at boot), but machined logs the lifecycle
// upgrade's start and end: Talos 1.13 "starting upgrade: installer_image=…",
// "upgrade completed successfully: exit_code=0", "upgrade failed:
// exit_code=N"; Talos 1.14 the same events as structured lines ("starting
// upgrade", "upgrade completed", "upgrade failed"). MachineService.Upgrade
// (Talos 1.12) logs the sequence it runs in the background: "upgrade
// sequence: 13 phase(s)" once it holds the lock ("stageUpgrade sequence: …"
// for a staged one), "upgrade sequence: failed" and "upgrade failed: <why>"
// when it fails; a sequence that could not take the lock logs "upgrade
// failed: locked" and ran nothing. The log is the boot's: it starts with
// "machined logger initialized".
const (
	logBootStart      = "machined logger initialized"
	logInstallStart   = "starting upgrade"
	logInstallDone    = "upgrade completed"
	logInstallFailed  = "upgrade failed"
	logSequenceFailed = "upgrade sequence: failed"
	logSequenceLocked = "upgrade failed: locked"
)

// logSequenceStart is the start of MachineService.Upgrade's sequence.
var logSequenceStart = regexp.MustCompile(`\b(upgrade|stageUpgrade) sequence: \d+ phase\(s\)`)

// InstallEvidence reads the node's machined log (talosctl logs machined) and
// says what it shows of the installs of the current boot.
func (c *Client) InstallEvidence(ctx context.Context, node string) (InstallState, error) {
	ctx, cancel := context.WithCancel(client.WithNode(ctx, node))
	defer cancel()

	stream, err := c.c.Logs(ctx, "system", common.ContainerDriver_CONTAINERD, "machined", false, -1)
	if err != nil {
		return InstallUnknown, nodeErr(node, "read machined's log", err)
	}

	r, err := client.ReadStream(stream)
	if err != nil {
		return InstallUnknown, nodeErr(node, "read machined's log", err)
	}
	defer r.Close()

	state, err := ParseInstallEvidence(r)

	return state, nodeErr(node, "read machined's log", err)
}

// ParseInstallEvidence reads a machined log and says what it shows of the
// installs of its boot: the last install's start and end.
func ParseInstallEvidence(r io.Reader) (InstallState, error) {
	var bootStart, started bool

	state := InstallNone

	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)

	for sc.Scan() {
		line := sc.Text()

		switch {
		case strings.Contains(line, logBootStart):
			bootStart = true
		case strings.Contains(line, logSequenceLocked):
			// A second sequence that ran nothing.
		case strings.Contains(line, logSequenceFailed) && started:
			state = InstallFailed
		case logSequenceStart.MatchString(line):
			started, state = true, InstallSequence
		case strings.Contains(line, logInstallStart):
			started, state = true, InstallRunning
		case strings.Contains(line, logInstallDone) && started:
			state = InstallDone
		case strings.Contains(line, logInstallFailed) && started:
			state = InstallFailed
		}
	}

	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return InstallUnknown, err
	}

	if !started && !bootStart {
		return InstallUnknown, nil
	}

	return state, nil
}
