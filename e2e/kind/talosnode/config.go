package talosnode

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

// generated are the machine configs and the talosconfig of a cluster.
type generated struct {
	bundle      *secrets.Bundle
	configs     map[string][]byte // by node name
	talosconfig *clientconfig.Config
}

// generateConfigs generates each node's machine config with machinery, as
// talosctl gen config does, for a cluster shaped as kind makes it: the
// cluster endpoint kind's, the pod and service subnets kind's, no CNI (the
// node image brings its own), CoreDNS the image the node image carries.
func generateConfigs(opts Options) (*generated, error) {
	contract, err := config.ParseContractFromVersion(opts.TalosVersion)
	if err != nil {
		return nil, fmt.Errorf("talos version %s: %w", opts.TalosVersion, err)
	}
	bundle, err := secrets.NewBundle(secrets.NewClock(), contract)
	if err != nil {
		return nil, fmt.Errorf("generate secrets: %w", err)
	}
	var endpoints []string
	for _, n := range opts.Nodes {
		if n.ControlPlane {
			endpoints = append(endpoints, n.IP.String())
		}
	}
	in, err := generate.NewInput(opts.Name, opts.Endpoint, strings.TrimPrefix(opts.KubernetesVersion, "v"),
		generate.WithSecretsBundle(bundle),
		generate.WithVersionContract(contract),
		generate.WithEndpointList(endpoints),
		generate.WithInstallImage("ghcr.io/siderolabs/installer:"+opts.TalosVersion),
		generate.WithRoles(role.MakeSet(role.Admin)),
	)
	if err != nil {
		return nil, fmt.Errorf("generate config input: %w", err)
	}
	g := &generated{bundle: bundle, configs: map[string][]byte{}}
	for _, n := range opts.Nodes {
		typ := machine.TypeWorker
		if n.ControlPlane {
			typ = machine.TypeControlPlane
		}
		base, err := in.Config(typ)
		if err != nil {
			return nil, fmt.Errorf("generate %s config: %w", typ, err)
		}
		// The hostname goes where the generated config keeps it: a
		// HostnameConfig document (Talos 1.12+), else machine.network.
		var docs []configconfig.Document
		hostnameDoc := false
		for _, d := range base.Documents() {
			d = d.Clone()
			if h, ok := d.(*network.HostnameConfigV1Alpha1); ok {
				h.ConfigAuto = nil
				h.ConfigHostname = n.Name
				hostnameDoc = true
			}
			docs = append(docs, d)
		}
		named, err := container.New(docs...)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", n.Name, err)
		}
		cfg, err := named.PatchV1Alpha1(func(c *v1alpha1.Config) error {
			if !hostnameDoc {
				if c.MachineConfig.MachineNetwork == nil { //nolint:staticcheck // the v1alpha1 layout of older Talos
					c.MachineConfig.MachineNetwork = &v1alpha1.NetworkConfig{} //nolint:staticcheck
				}
				c.MachineConfig.MachineNetwork.NetworkHostname = n.Name //nolint:staticcheck
			}
			if c.ClusterConfig.ClusterNetwork == nil {
				c.ClusterConfig.ClusterNetwork = &v1alpha1.ClusterNetworkConfig{}
			}
			c.ClusterConfig.ClusterNetwork.CNI = &v1alpha1.CNIConfig{CNIName: "none"}
			c.ClusterConfig.ClusterNetwork.PodSubnet = []string{opts.PodSubnet}
			c.ClusterConfig.ClusterNetwork.ServiceSubnet = []string{opts.ServiceSubnet}
			if n.ControlPlane {
				// Talos API access from Kubernetes for the plugin's Job, as
				// the operator's patch would give it.
				if c.MachineConfig.MachineFeatures == nil {
					c.MachineConfig.MachineFeatures = &v1alpha1.FeaturesConfig{}
				}
				c.MachineConfig.MachineFeatures.KubernetesTalosAPIAccessConfig = &v1alpha1.KubernetesTalosAPIAccessConfig{
					AccessEnabled:                     new(true),
					AccessAllowedRoles:                []string{string(role.Admin)},
					AccessAllowedKubernetesNamespaces: []string{"ichor-system"},
				}
			}
			if opts.CoreDNSImage != "" {
				c.ClusterConfig.CoreDNSConfig = &v1alpha1.CoreDNS{CoreDNSImage: opts.CoreDNSImage}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", n.Name, err)
		}
		if g.configs[n.Name], err = cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled)); err != nil {
			return nil, fmt.Errorf("machine %s: encode config: %w", n.Name, err)
		}
	}
	if g.talosconfig, err = in.Talosconfig(); err != nil {
		return nil, fmt.Errorf("generate talosconfig: %w", err)
	}
	return g, nil
}

// Node is one node of the kind cluster.
type Node struct {
	// Name is the container's name, also the hostname and Kubernetes node
	// name.
	Name string
	// IP is the node's address on the kind network.
	IP netip.Addr
	// ControlPlane tells a control-plane node from a worker.
	ControlPlane bool
}
