package job

import (
	"context"

	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// NewStagesEngine is the EngineFactory of the product: the engine of pkg/engine, with
// the Talos API reached as cfg.Talos says; by default through the talosconfig mounted in
// the Job's pod (/var/run/secrets/talos.dev/config, found by Talos' default search).
func NewStagesEngine(ctx context.Context, cfg EngineConfig) (Engine, func(), error) {
	tc, err := talos.Open(ctx, cfg.Talos)
	if err != nil {
		return nil, nil, err
	}

	eng := &engine.Engine{
		Kube:     cfg.Kube,
		Dynamic:  cfg.Dynamic,
		Talos:    tc,
		Options:  cfg.Options,
		Progress: cfg.Progress,
		Memo:     cfg.Memo,
		Out:      cfg.Out,
		Nodes:    cfg.Nodes,
	}

	return eng, func() { _ = tc.Close() }, nil
}
