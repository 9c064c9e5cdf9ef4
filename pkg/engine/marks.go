package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is what the Talos upgrade keeps of a node in Memo (the state ConfigMap):
// its mark, the boot ID before its install and the step announced last, all a new
// runner has to resume the node from.

// upgradeMark is what the Talos upgrade remembers, in Memo, of one node's
// upgrade to one target: all that cannot be read back from the node once it
// has rebooted.
type upgradeMark struct {
	// BootID is the node's boot ID read just before its Upgrade call; a
	// different boot ID later means the node rebooted since.
	BootID string `json:"bootID"`
	// Step is the step of the upgrade announced last (stepInstall,
	// stepInstalled, stepReboot): written before its call, so that a run
	// that finds it asks the node what happened (talos_resume.go).
	Step string `json:"step,omitempty"`
	// Legacy is true once the node answered the Upgrade call with
	// MachineService.Upgrade (a Talos before 1.13): the node drains,
	// installs and reboots by itself, in a sequence of its own.
	Legacy bool `json:"legacy,omitempty"`
	// Fallback is the boot ID in which the node came back on another version
	// than the target (its old one: an A/B fallback) and the operation
	// paused; the next run, a resume, tries the node's upgrade again.
	Fallback string `json:"fallback,omitempty"`
	// From is the Talos version the node ran when its install was announced
	// ("" when it could not be read): a node that comes back on another
	// version than this one and the target did not fall back.
	From string `json:"from,omitempty"`
	// Expect is what the node must run once it has booted its installer
	// (its schematic, its extensions), recorded before the install: after
	// the reboot they are gone from the node's API (checkCarried).
	Expect *stages.InstallExpect `json:"expect,omitempty"`
}

// following reports whether the mark is of an upgrade under way: recorded
// and not ended by a fallback.
func (m *upgradeMark) following() bool { return m != nil && m.Fallback == "" }

// markKey is the Memo key of node's upgrade to target.
func markKey(node string, target stages.Version) string {
	return "talos/" + node + "/" + target.String()
}

// mark reads node's upgrade mark from Memo; nil when there is none (or it
// does not parse: the node's version then decides).
func (r *talosRun) mark(node string) *upgradeMark {
	v, ok := r.e.Memo.Get(markKey(node, r.target))
	if !ok || v == "" {
		return nil
	}

	var m upgradeMark
	if err := json.Unmarshal([]byte(v), &m); err != nil || m.BootID == "" {
		return nil
	}

	return &m
}

// setMark writes node's upgrade mark and returns once it is durable.
func (r *talosRun) setMark(ctx context.Context, node string, m upgradeMark) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}

	return r.e.Memo.Set(ctx, markKey(node, r.target), string(b))
}

// Steps of a node's upgrade, as its mark records them. Each is written
// before the call it announces; stepInstalled after the Install call ended.
const (
	// stepInstall: the Install call is made (or about to be) in boot BootID.
	stepInstall = "install"
	// stepInstalled: the Install call ended with exit code 0; the reboot is
	// next.
	stepInstalled = "installed"
	// stepReboot: the node is asked to reboot (or reboots by itself, on a
	// Talos without the lifecycle service).
	stepReboot = "reboot"
)

// step is the mark's step, stepInstall when none is recorded.
func (m upgradeMark) step() string {
	if m.Step != "" {
		return m.Step
	}

	return stepInstall
}

// writeMark writes node's mark before the call it announces; a mark that
// cannot be written pauses (the call is not made), the node staying
// cordoned.
func (r *talosRun) writeMark(ctx context.Context, name string, mark upgradeMark) error {
	err := r.setMark(ctx, name, mark)

	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("stage %s: node %q: %w", r.stage.Name(), name, ctx.Err())
	}

	return r.e.pause(ctx, r.stage.Name(), name,
		fmt.Sprintf("node %q: record the %s step of its upgrade in the state: %v; nothing was called, the node stays cordoned", name, mark.step(), err),
		"fix what refuses the write to the state ConfigMap (kubectl ichor status; the runner's log), then resume (kubectl ichor resume)",
		err)
}
