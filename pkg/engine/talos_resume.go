package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// One install per node: the Talos upgrade of a node is two calls, Install
// (the new version into the other boot slot) and Reboot. A second Install
// in the same boot would flip the boot slots again and write the new version
// over the running one, losing the A/B fallback; so each call is announced in
// the node's mark (written to the state before the call) and, when a run
// finds a mark of an upgrade under way, what happens next is decided from
// what the node reports: its boot ID, its version and, in the boot the
// install was announced in, machined's log of the installs of that boot.
//
// This file is that decision (decide, a pure function with its own table test) and
// the look at the node it is made from.

// nodeSeen is what a node reports when a run decides its next step.
type nodeSeen struct {
	reachable bool
	bootID    string
	version   string
	// evidence is read only in the boot the install was announced in;
	// evidenceErr is why it could not be read (the node answered the rest).
	evidence    talos.Evidence
	evidenceErr error
}

// resumeAction is what a run does next with a node whose upgrade is under
// way.
type resumeAction int

const (
	actInstall resumeAction = iota // install, then reboot
	actReboot                      // installed in this boot: reboot, never install again
	actFollow                      // rebooting or rebooted: follow it to the target
	actVerify                      // on the target: verify
	actWait                        // an install runs on the node: look again
	actPause                       // the node cannot tell whether it installed: pause
	actForeign                     // another installer's install is staged or runs in this boot: pause
	actUnread                      // machined's log could not be read: look again, within the install bound
)

func (a resumeAction) String() string {
	return [...]string{"install", "reboot", "follow", "verify", "wait", "pause", "foreign", "unread"}[a]
}

// decide is what to do with a node whose mark says its upgrade to target is
// under way, from what the node reports; chosen is the installer chosen for
// the node in this operation. Never a second install in the boot the mark
// announced one in, unless the node says none ran or it failed; never a
// reboot into an install of another installer than chosen.
func decide(mark upgradeMark, seen nodeSeen, target, chosen string) resumeAction {
	switch {
	case !seen.reachable:
		return actFollow // going down, down, or coming back: the boot ID will say
	case seen.version == target:
		return actVerify // rebooted into it already
	case seen.bootID != mark.BootID:
		return actFollow // rebooted since, on the old version: follow says it fell back
	}

	ev := seen.evidence
	installed := mark.step() == stepInstalled || mark.step() == stepReboot

	if seen.evidenceErr != nil && (mark.Legacy || !installed) {
		return actUnread // what happened in this boot is in machined's log alone
	}

	// The same boot as the mark's, on the old version.
	if mark.Legacy || ev.State == talos.InstallSequence {
		// MachineService.Upgrade's sequence reboots the node by itself (a
		// Reboot cannot take over an upgrade sequence): follow it, unless
		// machined says it failed (the node did not reboot: call again).
		if ev.State == talos.InstallFailed {
			return actInstall
		}

		return actFollow
	}

	if installed {
		// Installed; the reboot never came (or is still shutting down):
		// asking again is harmless.
		return actReboot
	}

	switch ev.State {
	case talos.InstallDone:
		// Installed in this boot: by this operation, or by another one
		// (aborted between its install and its reboot, talosctl upgrade
		// --no-reboot). Only the chosen installer's install is booted; one
		// whose start rolled out of the log cannot be told apart.
		if !sameInstaller(ev.Image, chosen) {
			return actForeign
		}

		return actReboot
	case talos.InstallNone, talos.InstallFailed:
		return actInstall
	case talos.InstallRunning:
		if ev.Image != "" && !sameInstaller(ev.Image, chosen) {
			return actForeign
		}

		return actWait
	}

	return actPause
}

// look reads what a node reports for decide: its boot ID (a short look: it
// may be down), its version, and in the mark's boot machined's log of the
// installs.
func (r *talosRun) look(ctx context.Context, n *osNode, mark upgradeMark) (nodeSeen, error) {
	stage, name, ip := r.stage.Name(), n.Name, n.InternalIP

	callCtx, cancel := context.WithTimeout(ctx, talosPollCallTimeout)
	defer cancel()

	boot, err := r.e.Talos.BootID(callCtx, ip)

	switch {
	case ctx.Err() != nil:
		return nodeSeen{}, fmt.Errorf("stage %s: node %q: %w", stage, name, ctx.Err())
	case talos.IsPermissionDenied(err):
		return nodeSeen{}, r.e.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	case err != nil:
		return nodeSeen{}, nil // unreachable, or not answering: follow it
	}

	version, err := r.e.Talos.Version(callCtx, ip)
	if err != nil {
		return nodeSeen{}, nil
	}

	seen := nodeSeen{reachable: true, bootID: boot, version: version}

	if boot == mark.BootID && version != r.target.String() && (mark.step() == stepInstall || mark.Legacy) {
		// The log gets its own bound: it is the one read of a node that
		// answered that can be long, and its answer alone says what the boot
		// did.
		evCtx, cancel := context.WithTimeout(ctx, min(installEvidenceTimeout, r.opts.UpgradeTimeout))
		ev, err := r.e.Talos.InstallEvidence(evCtx, ip)

		cancel()

		switch {
		case ctx.Err() != nil:
			return nodeSeen{}, fmt.Errorf("stage %s: node %q: %w", stage, name, ctx.Err())
		case talos.IsPermissionDenied(err):
			return nodeSeen{}, r.e.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
		case err != nil:
			seen.evidenceErr = err

			return seen, nil
		}

		seen.evidence = ev
		r.e.node(stage, name, PhaseUpgrading, "boot %s, the one its install was announced in; machined's log: %s", shortID(boot), ev)
	}

	return seen, nil
}

// installEvidenceTimeout bounds one read of machined's log (never more than
// the install's own bound).
const installEvidenceTimeout = 20 * time.Second
