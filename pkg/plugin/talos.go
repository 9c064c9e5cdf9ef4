package plugin

import (
	"context"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// connectTalos opens the Talos client the flags name. Its errors (no talosconfig, naming
// where it looked; no usable context) are already one line saying what to do.
func connectTalos(ctx context.Context, flags TalosFlags) (discovery.TalosReader, error) {
	c, err := talos.Open(ctx, talos.Options{ConfigPath: flags.ConfigPath, Context: flags.Context, Endpoints: flags.Endpoints})
	if err != nil {
		return nil, err
	}

	return c, nil
}
