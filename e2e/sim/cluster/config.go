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
	"github.com/siderolabs/talos/pkg/machinery/config/types/k8s"
	"github.com/siderolabs/talos/pkg/machinery/config/types/network"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/gendata"
	"github.com/siderolabs/talos/pkg/machinery/role"

	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
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

// emptySchematic is Image Factory's empty schematic (Talos' pkg/images
// DefaultInstallerImageSchematic; machinery does not carry it).
const emptySchematic = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba"

// installImage is the installer a config generated for Talos version under
// contract c names, as talosctl gen config of that version writes it: the
// generic installer before 1.14, the Image Factory's installer of the empty
// schematic from 1.14 (whose configs are documents; a v1alpha1 config on
// 1.14 was born on 1.13 and names what 1.13 wrote).
func installImage(c *config.VersionContract, version string) string {
	if c.MultidocKubernetesConfigSupported() {
		return gendata.ImageFactory + "/metal-installer/" + emptySchematic + ":" + version
	}
	return gendata.ImagesRegistry + "/" + gendata.ImagesUsername + "/installer:" + version
}

func generateConfigs(opts Options, net addressPlan, mirror *simmachine.Mirror) (*generated, error) {
	contract, err := config.ParseContractFromVersion(opts.TalosVersion)
	if err != nil {
		return nil, fmt.Errorf("talos version %s: %w", opts.TalosVersion, err)
	}
	// A cluster with v1alpha1 configs on a Talos that writes documents was
	// born before Talos 1.14: its configs (and secrets) are of 1.13's kind, or
	// of the version it was born on.
	legacy := contract
	if contract.MultidocKubernetesConfigSupported() && opts.ConfigLayout != LayoutMultiDoc {
		legacy = config.TalosVersion1_13
	}
	if opts.BornOn != "" && opts.ConfigLayout != LayoutMultiDoc {
		born, err := config.ParseContractFromVersion(opts.BornOn)
		if err != nil {
			return nil, fmt.Errorf("talos version %s: %w", opts.BornOn, err)
		}
		if born.Greater(legacy) {
			born = legacy
		}
		legacy = born
	}
	bundle, err := secrets.NewBundle(secrets.NewClock(), legacy)
	if err != nil {
		return nil, fmt.Errorf("generate secrets: %w", err)
	}
	var endpoints []string
	for i := range opts.ControlPlanes {
		endpoints = append(endpoints, net.machine(i).String())
	}
	input := func(c *config.VersionContract) (*generate.Input, error) {
		in, err := generate.NewInput(opts.Name, "https://"+net.apiServer().String()+":6443",
			strings.TrimPrefix(opts.KubernetesVersion, "v"),
			generate.WithSecretsBundle(bundle),
			generate.WithVersionContract(c),
			generate.WithEndpointList(endpoints),
			generate.WithInstallImage(installImage(c, opts.TalosVersion)),
			generate.WithAdditionalSubjectAltNames([]string{net.apiServer().String()}),
			generate.WithRoles(role.MakeSet(role.Admin)),
		)
		if err != nil {
			return nil, fmt.Errorf("generate config input: %w", err)
		}
		return in, nil
	}
	// bases[layout][controlPlane] is the generated config a machine starts from.
	bases := map[string]map[bool]config.Provider{}
	layouts := []string{opts.ConfigLayout}
	if opts.ConfigLayout == LayoutMixed {
		layouts = []string{LayoutV1Alpha1, LayoutMultiDoc}
	}
	var in *generate.Input
	for _, layout := range layouts {
		c := legacy
		if layout == LayoutMultiDoc {
			c = contract
		}
		if in, err = input(c); err != nil {
			return nil, err
		}
		bases[layout] = map[bool]config.Provider{}
		for _, controlPlane := range []bool{true, false} {
			typ := machine.TypeWorker
			if controlPlane {
				typ = machine.TypeControlPlane
			}
			cfg, err := in.Config(typ)
			if err != nil {
				return nil, fmt.Errorf("generate %s config (%s): %w", typ, layout, err)
			}
			bases[layout][controlPlane] = cfg
		}
	}
	g := &generated{bundle: bundle}
	for i := range opts.ControlPlanes + opts.Workers {
		spec := machineSpec{IP: net.machine(i), ControlPlane: i < opts.ControlPlanes}
		spec.Name = MachineName(i, opts.ControlPlanes)
		var base config.Provider
		switch {
		case opts.ConfigLayout != LayoutMixed:
			base = bases[opts.ConfigLayout][spec.ControlPlane]
		case i%3 == 0:
			base = bases[LayoutV1Alpha1][spec.ControlPlane]
		case i%3 == 1:
			base = bases[LayoutMultiDoc][spec.ControlPlane]
		default:
			if base, err = mixLayouts(bases[LayoutMultiDoc][spec.ControlPlane], bases[LayoutV1Alpha1][spec.ControlPlane]); err != nil {
				return nil, fmt.Errorf("machine %s: %w", spec.Name, err)
			}
		}
		cfg, err := personalize(base, spec, opts)
		if err != nil {
			return nil, fmt.Errorf("machine %s: %w", spec.Name, err)
		}
		spec.Config, err = cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		if err != nil {
			return nil, fmt.Errorf("machine %s: encode config: %w", spec.Name, err)
		}
		if mirror != nil {
			spec.Config = mirror.Images(spec.Config)
		}
		g.machines = append(g.machines, spec)
	}
	g.talosconfig, err = in.Talosconfig()
	if err != nil {
		return nil, fmt.Errorf("generate talosconfig: %w", err)
	}
	return g, nil
}

// mixLayouts returns the multi-doc config with its kubelet and
// kube-apiserver settings moved back to the v1alpha1 document, where legacy
// keeps them: one node with components in each layout, which Talos 1.14
// accepts as long as no component is set in both.
func mixLayouts(multi, legacy config.Provider) (config.Provider, error) {
	var docs []configconfig.Document
	for _, d := range multi.Documents() {
		if d.Kind() == k8s.KubeletConfig || d.Kind() == k8s.KubeAPIServerConfig {
			continue
		}
		docs = append(docs, d.Clone())
	}
	c, err := container.New(docs...)
	if err != nil {
		return nil, err
	}
	old := legacy.RawV1Alpha1()
	return c.PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
		cfg.MachineConfig.MachineKubelet = old.MachineConfig.MachineKubelet.DeepCopy() //nolint:staticcheck // the v1alpha1 layout, on purpose
		if cfg.MachineConfig.Type().IsControlPlane() {
			if cfg.ClusterConfig == nil {
				cfg.ClusterConfig = &v1alpha1.ClusterConfig{}
			}
			// Only the image: the admission control and audit policy of the
			// v1alpha1 section would conflict with their 1.14 documents.
			cfg.ClusterConfig.APIServerConfig = &v1alpha1.APIServerConfig{ //nolint:staticcheck // the v1alpha1 layout, on purpose
				ContainerImage: old.ClusterConfig.APIServerConfig.ContainerImage, //nolint:staticcheck // the v1alpha1 layout, on purpose
			}
		}
		return nil
	})
}

// personalize gives a machine its own hostname and, when asked, the Talos API
// access from Kubernetes that the product's Job uses: as a
// KubeTalosAPIAccessConfig document on a config that keeps its Kubernetes
// settings in documents, as machine.features.kubernetesTalosAPIAccess
// otherwise (an operator adds the form their config uses). A control plane
// also gets the user's inline and extra manifests, in cluster.inlineManifests
// and cluster.extraManifests, which every Talos version reads.
func personalize(base config.Provider, spec machineSpec, opts Options) (config.Provider, error) {
	talosAPIAccess := opts.TalosAPIAccess
	var docs []configconfig.Document
	accessDocument := talosAPIAccess && spec.ControlPlane && base.Has(k8s.KubeControllerManagerConfig)
	if accessDocument {
		access := k8s.NewKubeTalosAPIAccessConfigV1Alpha1()
		access.AccessAllowedRoles = []string{string(role.Admin)}
		access.AccessAllowedKubernetesNamespaces = []string{talosAccessNamespace}
		docs = append(docs, access)
	}
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
		if spec.ControlPlane && (len(opts.InlineManifests) > 0 || len(opts.ExtraManifests) > 0) {
			if cfg.ClusterConfig == nil {
				cfg.ClusterConfig = &v1alpha1.ClusterConfig{}
			}
			for _, m := range opts.InlineManifests {
				cfg.ClusterConfig.ClusterInlineManifests = append(cfg.ClusterConfig.ClusterInlineManifests, //nolint:staticcheck // the form every Talos reads
					v1alpha1.ClusterInlineManifest{InlineManifestName: m.Name, InlineManifestContents: m.Contents})
			}
			cfg.ClusterConfig.ExtraManifests = append(cfg.ClusterConfig.ExtraManifests, opts.ExtraManifests...)
		}
		if args := opts.KernelArgs[spec.Name]; len(args) > 0 {
			// Talos refuses extraKernelArgs with the UKI command line (1.13.4+).
			cfg.MachineConfig.MachineInstall.InstallExtraKernelArgs = append([]string(nil), args...) //nolint:staticcheck // what configs in the field carry
			cfg.MachineConfig.MachineInstall.InstallGrubUseUKICmdline = new(false)
		}
		if talosAPIAccess && spec.ControlPlane && !accessDocument {
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
