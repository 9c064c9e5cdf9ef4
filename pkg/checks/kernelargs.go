package checks

import (
	"context"
	"fmt"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// KernelArgs warns, per node, about kernel arguments the Talos upgrade will not carry.
// From Talos 1.13 a node is upgraded through LifecycleService.Upgrade, which does not pass
// the config's machine.install.extraKernelArgs to the installer
// (internal/app/lifecycle/lifecycle.go: the upgrade's installer options carry none;
// MachineService.Upgrade, which a 1.12 node is upgraded with, did), so a GRUB node that
// builds its command line itself (machine.install.grubUseUKICmdline false) boots the new
// Talos without them (siderolabs/talos#13967). It applies only there: a node that boots a
// UKI with systemd-boot (SecurityState bootedWithUKI) and a GRUB node on the UKI's command
// line take their arguments from the UKI and never applied extraKernelArgs. Talos 1.14's
// documents hold no kernel arguments (UnattendedInstallConfig names the installer only):
// extraKernelArgs stays in the v1alpha1 install section. What keeps them is the schematic:
// its customization.extraKernelArgs, in an installer built by Image Factory from it.
type KernelArgs struct{}

// Name implements Check.
func (KernelArgs) Name() string { return "kernel arguments" }

// lifecycleFrom is the first Talos version upgraded through LifecycleService.
var lifecycleFrom = stages.MustParseVersion("v1.13.0")

// Run implements Check.
func (KernelArgs) Run(_ context.Context, in *Input) api.Check {
	var lost, unknown []string

	for _, n := range active(in.Snapshot) {
		args, reason := droppedKernelArgs(n)
		if len(args) == 0 {
			continue
		}

		line := fmt.Sprintf("%s (%s)", n.Name, strings.Join(args, " "))

		if reason == "" {
			lost = append(lost, line)
		} else {
			unknown = append(unknown, line+": "+reason)
		}
	}

	if len(lost) == 0 && len(unknown) == 0 {
		return ok("no node's machine.install.extraKernelArgs would be dropped by the upgrade")
	}

	var parts []string

	if len(lost) > 0 {
		parts = append(parts, fmt.Sprintf("%s: GRUB without the UKI command line; Talos' lifecycle upgrade does not carry machine.install.extraKernelArgs "+
			"(siderolabs/talos#13967): they boot %s without them", text.Summarize(lost), in.Target))
	}

	if len(unknown) > 0 {
		parts = append(parts, fmt.Sprintf("%s: may boot %s without them", text.Summarize(unknown), in.Target))
	}

	return warn(strings.Join(parts, "; "),
		"keep them in the schematic: add them to its customization.extraKernelArgs in Image Factory and upgrade with that schematic's installer "+
			"(--installer-image <factory>/<platform>-installer/<schematic>:"+in.Target.String()+"); or upgrade these nodes with talosctl upgrade --legacy (until Talos 1.18)")
}

// droppedKernelArgs are node n's machine.install.extraKernelArgs that the upgrade would
// drop, and, when its boot loader cannot be told, why; none when the upgrade carries them
// or the node never applied them.
func droppedKernelArgs(n discovery.Node) ([]string, string) {
	if n.Talos == nil || n.Talos.Config == nil || n.Talos.Config.Machine() == nil {
		return nil, ""
	}

	install := n.Talos.Config.Machine().Install()
	if install == nil || len(install.ExtraKernelArgs()) == 0 || install.GrubUseUKICmdline() {
		return nil, ""
	}

	if v, err := stages.ParseVersion(n.Talos.Version); err == nil && v.Compare(lifecycleFrom) < 0 {
		// Upgraded through MachineService.Upgrade, which passes them.
		return nil, ""
	}

	switch {
	case n.Talos.Installed == nil:
		return install.ExtraKernelArgs(), "its boot loader was not read"
	case n.Talos.Installed.BootedWithUKI:
		return nil, ""
	}

	return install.ExtraKernelArgs(), ""
}
