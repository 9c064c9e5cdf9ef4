package talos

import (
	"bufio"
	"context"
	"errors"
	"io"
	"regexp"
	"strconv"
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
// as a resource (the installer writes the inactive boot slot and makes it
// the bootloader's default; machined reads it only at boot), but machined
// logs the lifecycle upgrade's start, with the installer image it runs, and
// its end (internal/app/lifecycle/lifecycle.go): Talos 1.13 with log.Printf
// ("starting upgrade: installer_image=<image>, disk=/dev/sda", "upgrade
// completed successfully: exit_code=0", "upgrade failed: exit_code=N");
// Talos 1.14 with machined's zap logger, the fields as JSON ("starting
// upgrade {..., "installer_image": "<image>", ...}", "upgrade completed
// {...}", "upgrade failed {...}"). MachineService.Upgrade (Talos 1.12) logs
// the request ("validating "<image>""), then the sequence it runs in the
// background: "upgrade sequence: 13 phase(s)" once it holds the lock
// ("stageUpgrade sequence: …" for a staged one), "performing upgrade via
// "<image>"" in its install phase, "upgrade sequence: failed" and "upgrade
// failed: <why>" when it fails; a sequence that could not take the lock logs
// "upgrade failed: locked" and ran nothing. The log is the boot's: it starts
// with "machined logger initialized".
const (
	logBootStart      = "machined logger initialized"
	logInstallStart   = "starting upgrade"
	logInstallDone    = "upgrade completed"
	logInstallFailed  = "upgrade failed"
	logSequenceFailed = "upgrade sequence: failed"
	logSequenceLocked = "upgrade failed: locked"
)

var (
	// logSequenceStart is the start of MachineService.Upgrade's sequence.
	logSequenceStart = regexp.MustCompile(`\b(upgrade|stageUpgrade) sequence: \d+ phase\(s\)`)
	// logImagePrinted is the installer image of Talos 1.13's start line.
	logImagePrinted = regexp.MustCompile(`installer_image=([^,\s]+)`)
	// logImageField is the installer image field of Talos 1.14's.
	logImageField = regexp.MustCompile(`"installer_image":\s*("(?:[^"\\]|\\.)*")`)
	// logImageLegacy is the image of a MachineService.Upgrade request or of
	// its install phase.
	logImageLegacy = regexp.MustCompile(`(?:validating|performing upgrade via) ("(?:[^"\\]|\\.)*")`)
)

// EvidenceTailLines bounds how much of machined's log InstallEvidence reads:
// its last lines, as many as Talos' in-memory log of a service holds at most
// (1 MiB, logging.DesiredCapacity, at a line of 100 bytes or more). Talos
// answers a bounded read from its buffer without following it.
const EvidenceTailLines = 10000

// Evidence is what a node's machined log shows of the installs of its
// current boot.
type Evidence struct {
	// State is where the last install stands.
	State InstallState
	// Image is the installer image the last install ran, as machined logged
	// it; "" when the log does not name it (its start rolled out of the log).
	Image string
}

func (e Evidence) String() string {
	if e.Image == "" || e.State == InstallNone || e.State == InstallUnknown {
		return e.State.String()
	}

	return e.State.String() + " (" + e.Image + ")"
}

// InstallEvidence reads the node's machined log (talosctl logs machined
// --tail EvidenceTailLines) and says what it shows of the installs of the
// current boot. The read ends with ctx: give it its own deadline.
func (c *Client) InstallEvidence(ctx context.Context, node string) (Evidence, error) {
	ctx, cancel := context.WithCancel(client.WithNode(ctx, node))
	defer cancel()

	stream, err := c.c.Logs(ctx, "system", common.ContainerDriver_CONTAINERD, "machined", false, EvidenceTailLines)
	if err != nil {
		return Evidence{}, nodeErr(node, "read machined's log", err)
	}

	r, err := client.ReadStream(stream)
	if err != nil {
		return Evidence{}, nodeErr(node, "read machined's log", err)
	}
	defer r.Close()

	ev, err := ParseInstallEvidence(r)
	if err == nil {
		// The stream ends quietly when its context does: what was read is
		// not the log.
		err = ctx.Err()
	}

	if err != nil {
		return Evidence{}, nodeErr(node, "read machined's log", err)
	}

	return ev, nil
}

// ParseInstallEvidence reads a machined log and says what it shows of the
// installs of its boot: the last install's start, its image and its end.
// An end whose start the log no longer holds is an install of an image it
// cannot name.
func ParseInstallEvidence(r io.Reader) (Evidence, error) {
	var (
		bootStart, started bool
		validated          string // the image of the last MachineService.Upgrade request
	)

	ev := Evidence{State: InstallNone}

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
			ev.State = InstallFailed
		case logSequenceStart.MatchString(line):
			started, ev = true, Evidence{State: InstallSequence, Image: validated}
		case strings.Contains(line, logInstallStart):
			started, ev = true, Evidence{State: InstallRunning, Image: startImage(line)}
		case strings.Contains(line, logInstallDone):
			started, ev.State = true, InstallDone
		case strings.Contains(line, logInstallFailed) && started:
			ev.State = InstallFailed
		case logImageLegacy.MatchString(line):
			image := unquote(logImageLegacy.FindStringSubmatch(line)[1])
			if ev.State == InstallSequence {
				ev.Image = image
			} else {
				validated = image
			}
		}
	}

	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return Evidence{}, err
	}

	if !started && !bootStart {
		return Evidence{State: InstallUnknown}, nil
	}

	return ev, nil
}

// startImage is the installer image of a lifecycle upgrade's start line.
func startImage(line string) string {
	if m := logImageField.FindStringSubmatch(line); m != nil {
		return unquote(m[1])
	}

	if m := logImagePrinted.FindStringSubmatch(line); m != nil {
		return m[1]
	}

	return ""
}

func unquote(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}

	return strings.Trim(s, `"`)
}
