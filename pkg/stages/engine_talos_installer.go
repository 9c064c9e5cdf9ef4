package stages

import (
	"context"
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// installer returns the installer image a node with active config cfg is
// upgraded with: --image, or the one ChooseInstaller derives from what the
// node runs, read from its Talos now (its extensions and schematic are
// what it booted with: read again at each decision, never remembered).
func (r *talosRun) installer(ctx context.Context, n discovery.Node, cfg config.Provider) (string, error) {
	if r.stage.Image != "" {
		return r.stage.Image, nil
	}

	configured := ""
	if cfg != nil {
		configured = discovery.InstallImage(cfg)
	} else if n.Talos != nil {
		configured = n.Talos.InstallImage
	}

	readCtx, cancel := context.WithTimeout(ctx, talosReadTimeout)
	defer cancel()

	installed, err := r.e.Talos.Installed(readCtx, n.InternalIP)
	if err != nil {
		return "", fmt.Errorf("node %q: read its system extensions: %w", n.Name, err)
	}

	choice, err := ChooseInstaller(n.Name, configured, &installed, "", r.target)
	if err != nil {
		return "", err
	}

	return choice.Image, nil
}

// installerAction is what to do when a node's installer cannot be derived
// while the operation runs: resume takes no --image, so the operation is
// ended and started again with one.
func installerAction(target Version) string {
	return fmt.Sprintf("kubectl ichor abort, then kubectl ichor upgrade talos --to %s --image <installer that keeps the node's extensions>:%s", target, target)
}
