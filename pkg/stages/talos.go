package stages

import (
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/constants"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// TalosOS is the single stage of a Talos OS upgrade: each node, control planes one at a
// time then workers a batch at a time, is cordoned and drained, upgraded with an installer
// image and rebooted, verified and uncordoned.
type TalosOS struct {
	// Target is the Talos version to install.
	Target Version
	// Installers are the operator's explicit installers (--installer-image,
	// --drop-extensions); a node without one gets the installer
	// ChooseInstaller derives from what it runs.
	Installers InstallerFlags
}

// Name is the stage's name as plans and state show it.
func (TalosOS) Name() string { return "TalosOS" }

// Description says what the stage does, in one line.
func (TalosOS) Description() string {
	return "cordon, drain, Talos upgrade with the installer image, reboot, node Ready on the new version (and etcd healthy on control planes), uncordon"
}

// Work is what one of the stage's batches waits for: a drain and a reboot.
func (TalosOS) Work() Work { return WorkReboot }

// Installer returns the installer node n is upgraded with (ChooseInstaller
// over what discovery read of it).
func (t TalosOS) Installer(n discovery.Node) (Installer, error) {
	var (
		configured string
		installed  *talos.Installed
	)

	if n.Talos != nil {
		configured, installed = n.Talos.InstallImage, n.Talos.Installed
	}

	return ChooseInstaller(n.Name, configured, installed, t.Installers, t.Target)
}

// Changes returns what the stage changes on node n: the Talos version and the installer.
func (t TalosOS) Changes(n discovery.Node) ([]api.Change, error) {
	if n.Talos == nil {
		return nil, fmt.Errorf("node %q: stage %s: no Talos version was read", n.Name, t.Name())
	}

	installer, err := t.Installer(n)
	if err != nil {
		return nil, fmt.Errorf("stage %s: %w", t.Name(), err)
	}

	return []api.Change{
		{Component: "talos", From: n.Talos.Version, To: t.Target.String()},
		{Component: "installer", From: n.Talos.InstallImage, To: installer.Image, Reason: installer.Reason()},
	}, nil
}

// InstalledOf is what node n runs that its installer must keep, for the plan;
// nil when it was not read.
func InstalledOf(n discovery.Node) *api.Installed {
	if n.Talos == nil || n.Talos.Installed == nil {
		return nil
	}

	in := n.Talos.Installed
	out := &api.Installed{Platform: in.Platform, SecureBoot: in.SecureBoot}

	if s, ok := in.Schematic(); ok {
		out.Schematic = s.Version
	}

	for _, e := range in.Extensions {
		if e.Name != constants.ImageFactorySchematicExtensionName {
			out.Extensions = append(out.Extensions, e.String())
		}
	}

	return out
}

// Done reports whether node n already runs the target Talos version.
func (t TalosOS) Done(n discovery.Node) bool {
	return n.Talos != nil && n.Talos.Version == t.Target.String()
}
