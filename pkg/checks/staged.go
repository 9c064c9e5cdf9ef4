package checks

import (
	"context"
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// StagedConfig refuses a node whose persistent machine config differs from its active
// one (render.Staged, as the engine refuses it): a config applied in mode STAGED waits
// for the next reboot, and the Talos upgrade's reboot would activate a change nobody
// chose for it.
type StagedConfig struct{}

// Name implements Check.
func (StagedConfig) Name() string { return "staged config" }

// Run implements Check.
func (StagedConfig) Run(_ context.Context, in *Input) api.Check {
	var (
		staged []string
		ip     string
		read   int
	)

	for _, n := range active(in.Snapshot) {
		if n.Talos == nil || !n.Talos.StagedRead {
			continue
		}

		read++

		if n.Talos.Staged != "" {
			staged = append(staged, fmt.Sprintf("%s: a machine config change is staged for the next reboot (%s)", n.Name, n.Talos.Staged))

			if ip == "" {
				ip = n.InternalIP
			}
		}
	}

	switch {
	case len(staged) > 0:
		return refused(text.Summarize(staged)+": the upgrade's reboot would activate it", render.StagedAction(ip))
	case read == 0:
		return warn("the nodes' persistent machine configs were not read", "look for a staged change before the upgrade: talosctl -n <node> get machineconfig persistent")
	}

	return ok(fmt.Sprintf("no machine config change staged on %d node(s)", read))
}
