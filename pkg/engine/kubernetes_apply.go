package engine

import (
	"context"
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"
	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// This file is a node's config apply in a Kubernetes stage: its Node and active config
// read, a config staged for the next reboot refused, the render dry-run then applied
// (NO_REBOOT), each call under its own bound.

// getNode reads a Node from the run's watch, which shows at least what this runner
// last wrote to it (its cordon) or read of it from the API server, else from the API
// server (kube.Nodes.Get): what a visit decides on it (the kubelet version its render
// pins, whether ichor's cordon is there to lift) changes only by the runner's own steps,
// each verified on that same watch, or by a hand as likely to land a moment after a read
// of the API server as before it. Whether a node may be restarted is decided on a fresh
// read (cordonAndDrain).
func (r *kubeRun) getNode(ctx context.Context, name string) (*corev1.Node, error) {
	return r.e.nodes.Get(ctx, name)
}

// activeConfig reads a node's active config and its hash.
func (r *kubeRun) activeConfig(ctx context.Context, name, ip string) (config.Provider, string, error) {
	cfg, err := r.readConfig(ctx, name, ip, r.e.Talos.MachineConfig)
	if err != nil {
		return nil, "", fmt.Errorf("node %q: read machine config: %w", name, err)
	}

	hash, err := render.Hash(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("node %q: %w", name, err)
	}

	return cfg, hash, nil
}

// readConfig reads one of a node's configs (read: its active or its persistent one),
// under talosReadTimeout, again while its Talos API is unreachable.
func (r *kubeRun) readConfig(ctx context.Context, name, ip string, read func(context.Context, string) (config.Provider, error)) (config.Provider, error) {
	var cfg config.Provider

	err := r.whileUnreachable(ctx, name, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, talosReadTimeout)
		defer cancel()

		var err error

		cfg, err = read(ctx, ip)

		return err
	})

	return cfg, err
}

// refuseStaged refuses a node whose persistent config differs from its
// active one: a change staged for the next reboot, which an apply would
// overwrite (render.Staged, as the Talos upgrade refuses it).
func (r *kubeRun) refuseStaged(ctx context.Context, stage, name, ip string, active config.Provider) error {
	persistent, err := r.readConfig(ctx, name, ip, r.e.Talos.PersistentMachineConfig)
	if err != nil {
		err = fmt.Errorf("node %q: read persistent machine config: %w", name, err)

		return r.pause(ctx, stage, name, err.Error(), actionTalosAccess, err)
	}

	where, err := render.Staged(active, persistent)
	if err != nil {
		return r.pause(ctx, stage, name, err.Error(), actionResume, err)
	}

	if where == "" {
		return nil
	}

	err = fmt.Errorf("node %q: a machine config change is staged for the next reboot (%s): applying would overwrite it", name, where)

	return r.pause(ctx, stage, name, err.Error(), render.StagedAction(ip), err)
}

// apply dry-runs, then applies, the render, each call under its own
// deadline.
func (r *kubeRun) apply(ctx context.Context, stage, name, ip string, res *render.Result) error {
	what := describeChanges(res.Changed)

	r.e.node(stage, name, PhaseApplying, "dry run: %s", what)

	err := r.whileUnreachable(ctx, name, func(ctx context.Context) error {
		_, err := r.applyCall(ctx, ip, res.Bytes, true)

		return err
	})
	if err != nil {
		err = fmt.Errorf("node %q: apply (dry run): %w", name, err)

		return r.pause(ctx, stage, name, err.Error(), "nothing was changed on the node: "+actionResume, err)
	}

	r.e.node(stage, name, PhaseApplying, "applying %s (NO_REBOOT, bound %s)", what, r.opts.ApplyTimeout)

	result, err := r.applyCall(ctx, ip, res.Bytes, false)
	if err != nil {
		err = fmt.Errorf("node %q: apply: %w", name, err)

		return r.pause(ctx, stage, name, err.Error(),
			"the node may or may not have the new config; resuming reads it again and applies or only verifies", err)
	}

	r.e.node(stage, name, PhaseApplying, "applied %s (%s)", what, result.Mode)

	return nil
}

// applyCall is one ApplyConfiguration call under its own ApplyTimeout.
func (r *kubeRun) applyCall(ctx context.Context, ip string, data []byte, dryRun bool) (talos.ApplyResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opts.ApplyTimeout)
	defer cancel()

	return r.e.Talos.Apply(ctx, ip, data, dryRun)
}
