package cluster

import (
	"fmt"
	"net/netip"
	"strings"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/role"
)

// machineSpec is one machine of the cluster as generated: its identity and
// its machine config (multi-document YAML, as talosctl gen config writes it).
type machineSpec struct {
	Name         string
	IP           netip.Addr
	ControlPlane bool
	Config       []byte
}

// generated is a cluster's Talos-side configuration: one secrets bundle (its
// Kubernetes CA also serves the real control plane), a config per machine
// and the admin talosconfig.
type generated struct {
	bundle      *secrets.Bundle
	machines    []machineSpec
	talosconfig *clientconfig.Config
}

// talosAccessNamespace is the namespace the product runs in; the local cluster
// allows it Talos API access by default, as an operator following the README
// would.
const talosAccessNamespace = "ichor-system"

func generateConfigs(opts Options, net addressPlan) (*generated, error) {
	contract, err := config.ParseContractFromVersion(opts.TalosVersion)
	if err != nil {
		return nil, fmt.Errorf("talos version %s: %w", opts.TalosVersion, err)
	}
	bundle, err := secrets.NewBundle(secrets.NewClock(), contract)
	if err != nil {
		return nil, fmt.Errorf("generate secrets: %w", err)
	}
	var endpoints []string
	for i := range opts.ControlPlanes {
		endpoints = append(endpoints, net.machine(i).String())
	}
	in, err := generate.NewInput(opts.Name, "https://"+net.apiServer().String()+":6443",
		strings.TrimPrefix(opts.KubernetesVersion, "v"),
		generate.WithSecretsBundle(bundle),
		generate.WithVersionContract(contract),
		generate.WithEndpointList(endpoints),
		generate.WithInstallImage("ghcr.io/siderolabs/installer:"+opts.TalosVersion),
		generate.WithAdditionalSubjectAltNames([]string{net.apiServer().String()}),
		generate.WithRoles(role.MakeSet(role.Admin)),
	)
	if err != nil {
		return nil, fmt.Errorf("generate config input: %w", err)
	}
	cpCfg, err := in.Config(machine.TypeControlPlane)
	if err != nil {
		return nil, fmt.Errorf("generate control plane config: %w", err)
	}
	wCfg, err := in.Config(machine.TypeWorker)
	if err != nil {
		return nil, fmt.Errorf("generate worker config: %w", err)
	}
	g := &generated{bundle: bundle}
	for i := range opts.ControlPlanes + opts.Workers {
		spec := machineSpec{IP: net.machine(i), ControlPlane: i < opts.ControlPlanes}
		base := wCfg
		if spec.ControlPlane {
			spec.Name = fmt.Sprintf("cp-%d", i+1)
			base = cpCfg
		} else {
			spec.Name = fmt.Sprintf("worker-%d", i-opts.ControlPlanes+1)
		}
		cfg, err := personalize(base, spec, opts.TalosAPIAccess)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", spec.Name, err)
		}
		spec.Config, err = cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		if err != nil {
			return nil, fmt.Errorf("machine %s: encode config: %w", spec.Name, err)
		}
		g.machines = append(g.machines, spec)
	}
	g.talosconfig, err = in.Talosconfig()
	if err != nil {
		return nil, fmt.Errorf("generate talosconfig: %w", err)
	}
	return g, nil
}

// personalize gives a machine its own hostname and, when asked, the Talos API
// access from Kubernetes that the product's Job uses.
func personalize(base config.Provider, spec machineSpec, talosAPIAccess bool) (config.Provider, error) {
	var docs []configconfig.Document
	hasHostnameDoc := false
	for _, d := range base.Documents() {
		d = d.Clone()
		if h, ok := d.(*network.HostnameConfigV1Alpha1); ok {
			h.ConfigAuto = nil
			h.ConfigHostname = spec.Name
			hasHostnameDoc = true
		}
		docs = append(docs, d)
	}
	c, err := container.New(docs...)
	if err != nil {
		return nil, err
	}
	return c.PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
		if !hasHostnameDoc {
			if cfg.MachineConfig.MachineNetwork == nil { //nolint:staticcheck // legacy field for older contracts
				cfg.MachineConfig.MachineNetwork = &v1alpha1.NetworkConfig{} //nolint:staticcheck
			}
			cfg.MachineConfig.MachineNetwork.NetworkHostname = spec.Name //nolint:staticcheck
		}
		if talosAPIAccess && spec.ControlPlane {
			if cfg.MachineConfig.MachineFeatures == nil {
				cfg.MachineConfig.MachineFeatures = &v1alpha1.FeaturesConfig{}
			}
			cfg.MachineConfig.MachineFeatures.KubernetesTalosAPIAccessConfig = &v1alpha1.KubernetesTalosAPIAccessConfig{
				AccessEnabled:                     new(true),
				AccessAllowedRoles:                []string{string(role.Admin)},
				AccessAllowedKubernetesNamespaces: []string{talosAccessNamespace},
			}
		}
		return nil
	})
}
