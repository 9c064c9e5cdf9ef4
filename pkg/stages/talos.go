package stages

import (
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// TalosOS is the single stage of a Talos OS upgrade: each node, control planes one at a
// time then workers a batch at a time, is cordoned and drained, upgraded with an installer
// image and rebooted, verified and uncordoned.
type TalosOS struct {
	// Target is the Talos version to install.
	Target Version
	// Image overrides the installer image for every node; "" keeps each node's installer
	// repository (so a factory schematic is kept) with the tag set to Target.
	Image string
}

// Name is the stage's name as plans and state show it.
func (TalosOS) Name() string { return "TalosOS" }

// Description says what the stage does, in one line.
func (TalosOS) Description() string {
	return "cordon, drain, Talos upgrade with the installer image, reboot, node Ready on the new version (and etcd healthy on control planes), uncordon"
}

// Installer returns the installer image node n is upgraded with.
func (t TalosOS) Installer(n discovery.Node) (string, error) {
	if t.Image != "" {
		return t.Image, nil
	}

	if n.Talos == nil || n.Talos.InstallImage == "" {
		return "", fmt.Errorf("node %q: its machine config has no machine.install.image: pass the installer with --image REPO:TAG", n.Name)
	}

	image, err := render.WithTag(n.Talos.InstallImage, t.Target.String())
	if err != nil {
		return "", fmt.Errorf("node %q: installer image: %w", n.Name, err)
	}

	return image, nil
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
		{Component: "installer", From: n.Talos.InstallImage, To: installer},
	}, nil
}

// Done reports whether node n already runs the target Talos version.
func (t TalosOS) Done(n discovery.Node) bool {
	return n.Talos != nil && n.Talos.Version == t.Target.String()
}
