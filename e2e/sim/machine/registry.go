package machine

import (
	"context"
	"fmt"
	"sync"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/cosi-project/runtime/pkg/state/registry"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/containers"
	"github.com/siderolabs/talos/pkg/machinery/resources/cri"
	"github.com/siderolabs/talos/pkg/machinery/resources/etcd"
	"github.com/siderolabs/talos/pkg/machinery/resources/files"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/kubeaccess"
	"github.com/siderolabs/talos/pkg/machinery/resources/kubespan"
	networkres "github.com/siderolabs/talos/pkg/machinery/resources/network"
	"github.com/siderolabs/talos/pkg/machinery/resources/perf"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/resources/secrets"
	"github.com/siderolabs/talos/pkg/machinery/resources/security"
	"github.com/siderolabs/talos/pkg/machinery/resources/siderolink"
	"github.com/siderolabs/talos/pkg/machinery/resources/storage"
	timeres "github.com/siderolabs/talos/pkg/machinery/resources/time"
	"github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
)

// The resource definitions a simulated machine registers in its meta
// namespace, as machined registers them at start: clients (talosctl get,
// machinery's Client.ResolveResourceKind) list them to resolve a name or an
// alias ("machineconfig", "members", "svc", "podstatus") to a type and its
// default namespace, and Talos' COSI API refuses a type or a namespace that
// is not registered. Talos 1.14 registers the types below; a Talos 1.13
// machine registers them less those that came with 1.14 (machinery v1.13.9
// does not have them). The simulator fills only some of these types with
// resources (see the package documentation); the others list empty.

// talosNamespace is one namespace machined registers.
type talosNamespace struct {
	name        resource.Namespace
	description string
	since       int // the Talos 1.x minor it came with
}

func talosNamespaces() []talosNamespace {
	return []talosNamespace{
		{name: v1alpha1.NamespaceName, description: "Talos v1alpha1 subsystems glue resources."},
		{name: cluster.NamespaceName, description: "Cluster configuration and discovery resources."},
		{name: cluster.RawNamespaceName, description: "Cluster unmerged raw resources."},
		{name: config.NamespaceName, description: "Talos node configuration."},
		{name: containers.NamespaceName, description: "Talos-managed container resources.", since: 14},
		{name: cri.NamespaceName, description: "CRI Seccomp resources."},
		{name: etcd.NamespaceName, description: "etcd resources."},
		{name: files.NamespaceName, description: "Files and file-like resources."},
		{name: hardware.NamespaceName, description: "Hardware resources."},
		{name: k8s.NamespaceName, description: "Kubernetes all node types resources."},
		{name: k8s.ControlPlaneNamespaceName, description: "Kubernetes control plane resources."},
		{name: kubespan.NamespaceName, description: "KubeSpan resources."},
		{name: networkres.NamespaceName, description: "Networking resources."},
		{name: networkres.ConfigNamespaceName, description: "Networking configuration resources."},
		{name: perf.NamespaceName, description: "Stats resources."},
		{name: secrets.NamespaceName, description: "Resources with secret material."},
		{name: security.NamespaceName, description: "Security resources."},
		{name: storage.NamespaceName, description: "Storage resources.", since: 14},
	}
}

// talosDefinition is one resource type machined registers.
type talosDefinition struct {
	r     meta.ResourceWithRD
	since int // the Talos 1.x minor it came with (0: before 1.13)
}

func talosDefinitions() []talosDefinition {
	old := func(rs ...meta.ResourceWithRD) []talosDefinition {
		out := make([]talosDefinition, len(rs))
		for i, r := range rs {
			out[i] = talosDefinition{r: r}
		}
		return out
	}
	new14 := func(rs ...meta.ResourceWithRD) []talosDefinition {
		out := make([]talosDefinition, len(rs))
		for i, r := range rs {
			out[i] = talosDefinition{r: r, since: 14}
		}
		return out
	}
	var defs []talosDefinition
	// block
	defs = append(defs, old(&block.Device{}, &block.DiscoveredVolume{}, &block.DiscoveryRefreshRequest{},
		&block.DiscoveryRefreshStatus{}, &block.Disk{}, &block.MountRequest{}, &block.MountStatus{},
		&block.SwapStatus{}, &block.Symlink{}, &block.SystemDisk{}, &block.UserDiskConfigStatus{},
		&block.VolumeConfig{}, &block.VolumeLifecycle{}, &block.VolumeMountRequest{},
		&block.VolumeMountStatus{}, &block.VolumeStatus{}, &block.ZswapStatus{})...)
	defs = append(defs, new14(&block.FSScrubSchedule{}, &block.FSScrubStatus{}, &block.VolumeTrimSchedule{})...)
	// cluster, config, etcd, files
	defs = append(defs, old(&cluster.Affiliate{}, &cluster.Config{}, &cluster.Identity{}, &cluster.Info{},
		&cluster.Member{}, &config.MachineConfig{}, &config.MachineType{},
		&etcd.Config{}, &etcd.PKIStatus{}, &etcd.Spec{}, &etcd.Member{},
		&files.EtcFileSpec{}, &files.EtcFileStatus{})...)
	// containers (1.14), cri
	defs = append(defs, new14(&containers.ContainerSpec{}, &containers.ContainerImageStatus{},
		&containers.ContainerMountStatus{}, &containers.ContainerInstanceSpec{},
		&containers.ContainerInstanceStatus{}, &containers.ContainerLifecycle{},
		&cri.BaseRuntimeSpecConfig{}, &cri.CustomizationConfig{})...)
	defs = append(defs, old(&cri.ImageCacheConfig{}, &cri.SeccompProfile{}, &cri.RegistriesConfig{})...)
	// hardware
	defs = append(defs, old(&hardware.MemoryModule{}, &hardware.PCIDevice{}, &hardware.PCIDriverRebindConfig{},
		&hardware.PCIDriverRebindStatus{}, &hardware.PCRStatus{}, &hardware.Processor{},
		&hardware.SystemInformation{})...)
	defs = append(defs, new14(&hardware.CPUCore{})...)
	// k8s
	defs = append(defs, old(&k8s.AdmissionControlConfig{}, &k8s.AuditPolicyConfig{}, &k8s.AuthorizationConfig{},
		&k8s.APIServerConfig{}, &k8s.KubePrismEndpoints{}, &k8s.ConfigStatus{}, &k8s.ControllerManagerConfig{},
		&k8s.Endpoint{}, &k8s.ExtraManifestsConfig{}, &k8s.KubeletConfig{}, &k8s.KubeletKubeconfig{},
		&k8s.KubeletLifecycle{}, &k8s.KubeletSpec{}, &k8s.KubePrismConfig{}, &k8s.KubePrismStatuses{},
		&k8s.Manifest{}, &k8s.ManifestStatus{}, &k8s.BootstrapManifestsConfig{}, &k8s.NodeAnnotationSpec{},
		&k8s.NodeCordonedSpec{}, &k8s.NodeIP{}, &k8s.NodeIPConfig{}, &k8s.NodeLabelSpec{}, &k8s.Nodename{},
		&k8s.NodeStatus{}, &k8s.NodeTaintSpec{}, &k8s.SchedulerConfig{}, &k8s.StaticPod{},
		&k8s.StaticPodServerStatus{}, &k8s.StaticPodStatus{}, &k8s.SecretsStatus{})...)
	defs = append(defs, new14(&k8s.AuthenticationConfig{}, &k8s.EtcdEncryptionConfig{}, &k8s.KubeletStatus{})...)
	// kubeaccess, kubespan
	defs = append(defs, old(&kubeaccess.Config{}, &kubespan.Config{}, &kubespan.Endpoint{}, &kubespan.Identity{},
		&kubespan.PeerSpec{}, &kubespan.PeerStatus{})...)
	// network
	defs = append(defs, old(&networkres.AddressStatus{}, &networkres.AddressSpec{}, &networkres.DeviceConfigSpec{},
		&networkres.DNSResolveCache{}, &networkres.DNSUpstream{}, &networkres.EthernetSpec{}, &networkres.EthernetStatus{},
		&networkres.HardwareAddr{}, &networkres.HostDNSConfig{}, &networkres.HostnameStatus{}, &networkres.HostnameSpec{},
		&networkres.LinkAliasSpec{}, &networkres.LinkRefresh{}, &networkres.LinkStatus{}, &networkres.LinkSpec{},
		&networkres.NfTablesChain{}, &networkres.NodeAddress{}, &networkres.NodeAddressFilter{},
		&networkres.NodeAddressSortAlgorithm{}, &networkres.OperatorSpec{}, &networkres.PlatformConfig{},
		&networkres.ProbeSpec{}, &networkres.ProbeStatus{}, &networkres.ResolverStatus{}, &networkres.ResolverSpec{},
		&networkres.RouteStatus{}, &networkres.RouteSpec{}, &networkres.RoutingRuleSpec{}, &networkres.RoutingRuleStatus{},
		&networkres.Status{}, &networkres.TimeServerStatus{}, &networkres.TimeServerSpec{})...)
	defs = append(defs, new14(&networkres.BGPInstanceConfig{}, &networkres.BGPPeerStatus{}, &networkres.StaticHost{})...)
	// perf, runtime
	defs = append(defs, old(&perf.CPU{}, &perf.Memory{},
		&runtime.APIServiceConfig{}, &runtime.BootedEntry{}, &runtime.DevicesStatus{}, &runtime.Diagnostic{},
		&runtime.Environment{}, &runtime.EventSinkConfig{}, &runtime.ExtensionServiceConfig{},
		&runtime.ExtensionServiceConfigStatus{}, &runtime.ExtensionStatus{}, &runtime.KernelCmdline{},
		&runtime.KernelModuleSpec{}, &runtime.KernelParamSpec{}, &runtime.KernelParamDefaultSpec{},
		&runtime.KernelParamStatus{}, &runtime.KmsgLogConfig{},
		&runtime.LoadedKernelModule{}, //nolint:staticcheck // Talos still registers it
		&runtime.MaintenanceServiceConfig{}, &runtime.MaintenanceServiceRequest{}, &runtime.MachineResetSignal{},
		&runtime.MachineStatus{}, &runtime.MetaKey{}, &runtime.MetaLoaded{}, &runtime.MountStatus{},
		&runtime.OOMAction{}, &runtime.PlatformMetadata{}, &runtime.SBOMItem{}, &runtime.SecurityState{},
		&runtime.ServicePID{}, &runtime.UniqueMachineToken{}, &runtime.Version{},
		&runtime.WatchdogTimerConfig{}, &runtime.WatchdogTimerStatus{})...)
	defs = append(defs, new14(&runtime.BootID{}, &runtime.ImageFactorySchematic{}, &runtime.KernelModuleStatus{},
		&runtime.RebootRequest{}, &runtime.UnattendedInstallStatus{})...)
	// secrets, security, siderolink
	defs = append(defs, old(&secrets.API{}, &secrets.CertSAN{}, &secrets.EncryptionSalt{}, &secrets.Etcd{},
		&secrets.EtcdRoot{}, &secrets.Kubelet{}, &secrets.Kubernetes{}, &secrets.KubernetesDynamicCerts{},
		&secrets.KubernetesRoot{}, &secrets.MaintenanceRoot{}, &secrets.OSRoot{}, &secrets.Trustd{},
		&security.ImageVerificationRule{}, &security.TUFTrustedRoot{},
		&siderolink.Config{}, &siderolink.Status{}, &siderolink.Tunnel{})...)
	// storage (1.14)
	defs = append(defs, new14(&storage.LVMRefreshRequest{}, &storage.LVMPhysicalVolumeSpec{},
		&storage.LVMLogicalVolumeSpec{}, &storage.LVMLogicalVolumeStatus{}, &storage.LVMPhysicalVolumeStatus{},
		&storage.LVMValidationError{}, &storage.LVMVolumeGroupSpec{}, &storage.LVMVolumeGroupStatus{},
		&storage.MDArraySpec{}, &storage.MDArrayStatus{}, &storage.MDRefreshRequest{})...)
	// time, v1alpha1
	defs = append(defs, old(&timeres.AdjtimeStatus{}, &timeres.NTPStatus{}, &timeres.Status{},
		&v1alpha1.AcquireConfigSpec{}, &v1alpha1.AcquireConfigStatus{}, &v1alpha1.Service{})...)
	return defs
}

// newBootState returns the empty COSI state one boot of Talos 1.minor starts
// with: in memory (machined keeps no resource across a reboot), with the
// meta namespace holding the namespaces and resource definitions that Talos
// registers. The history options are machined's, so watches asking for tail
// events behave the same.
func newBootState(ctx context.Context, minor int) (state.State, error) {
	st := state.WrapCore(namespaced.NewState(func(ns resource.Namespace) state.CoreState {
		return inmem.NewStateWithOptions(
			inmem.WithHistoryInitialCapacity(8),
			inmem.WithHistoryMaxCapacity(1024),
			inmem.WithHistoryGap(4),
		)(ns)
	}))
	namespaces := registry.NewNamespaceRegistry(st)
	if err := namespaces.RegisterDefault(ctx); err != nil {
		return nil, fmt.Errorf("register meta namespace: %w", err)
	}
	definitions := registry.NewResourceRegistry(st)
	if err := definitions.RegisterDefault(ctx); err != nil {
		return nil, fmt.Errorf("register meta resources: %w", err)
	}
	for _, ns := range talosNamespaces() {
		if ns.since > minor {
			continue
		}
		if err := namespaces.Register(ctx, ns.name, ns.description); err != nil {
			return nil, fmt.Errorf("register namespace %s: %w", ns.name, err)
		}
	}
	for _, d := range talosDefinitions() {
		if d.since > minor {
			continue
		}
		if err := definitions.Register(ctx, d.r); err != nil {
			return nil, fmt.Errorf("register resource %s: %w", d.r.ResourceDefinition().Type, err)
		}
	}
	return st, nil
}

// bootState is a machine's COSI state as its readers hold it: every call
// goes to the state of the boot that is current when the call is made, so a
// reader (package talosapi) keeps one handle across reboots, as apid does.
type bootState struct {
	mu  sync.RWMutex
	cur state.CoreState
}

var _ state.CoreState = (*bootState)(nil)

func (b *bootState) get() state.CoreState {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.cur
}

func (b *bootState) set(st state.CoreState) {
	b.mu.Lock()
	b.cur = st
	b.mu.Unlock()
}

// Get implements state.CoreState.
func (b *bootState) Get(ctx context.Context, ptr resource.Pointer, opts ...state.GetOption) (resource.Resource, error) {
	return b.get().Get(ctx, ptr, opts...)
}

// List implements state.CoreState.
func (b *bootState) List(ctx context.Context, kind resource.Kind, opts ...state.ListOption) (resource.List, error) {
	return b.get().List(ctx, kind, opts...)
}

// Create implements state.CoreState.
func (b *bootState) Create(ctx context.Context, r resource.Resource, opts ...state.CreateOption) error {
	return b.get().Create(ctx, r, opts...)
}

// Update implements state.CoreState.
func (b *bootState) Update(ctx context.Context, r resource.Resource, opts ...state.UpdateOption) error {
	return b.get().Update(ctx, r, opts...)
}

// Destroy implements state.CoreState.
func (b *bootState) Destroy(ctx context.Context, ptr resource.Pointer, opts ...state.DestroyOption) error {
	return b.get().Destroy(ctx, ptr, opts...)
}

// Watch implements state.CoreState.
func (b *bootState) Watch(ctx context.Context, ptr resource.Pointer, ch chan<- state.Event, opts ...state.WatchOption) error {
	return b.get().Watch(ctx, ptr, ch, opts...)
}

// WatchKind implements state.CoreState.
func (b *bootState) WatchKind(ctx context.Context, kind resource.Kind, ch chan<- state.Event, opts ...state.WatchKindOption) error {
	return b.get().WatchKind(ctx, kind, ch, opts...)
}

// WatchKindAggregated implements state.CoreState.
func (b *bootState) WatchKindAggregated(ctx context.Context, kind resource.Kind, ch chan<- []state.Event, opts ...state.WatchKindOption) error {
	return b.get().WatchKindAggregated(ctx, kind, ch, opts...)
}
