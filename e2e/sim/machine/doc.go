// Package machine simulates one Talos Linux machine with Talos 1.13 and
// 1.14 semantics: its machine config and the rule deciding which changes
// apply without a reboot, its running and staged (A/B) Talos version, its
// boot ID, reboots, image pulls, machined's services, and the COSI resources
// Talos derives from the config and from what its kubelet reports
// (MachineConfig, Version, Nodename, NodeStatus, APIServerConfig,
// ControllerManagerConfig, SchedulerConfig and their final- forms from 1.14,
// KubeletSpec, Services, StaticPods, StaticPodStatus, Manifests,
// ManifestStatus, MachineStatus, the local EtcdMember, Identity, discovery
// Members), held in an in-memory COSI state with machinery's real resource
// types.
//
// Like machined, a machine starts every boot from an empty state: its meta
// namespace registers Talos' namespaces and resource definitions (registry.go),
// then the resources are rendered anew. Its services follow machined's
// service runner (services.go): a Service resource exists while its service
// runs, so a restart is Destroyed then Created. The MachineStatus follows
// Talos' stages and readiness checks (status.go). Members come from a
// Discovery shared by the machines of a cluster (discovery.go).
//
// It owns no network listener: package talosapi serves the Talos gRPC API in
// front of a Machine and calls the operations here (ApplyConfiguration, Pull,
// StageUpgrade, Upgrade, Reboot, Rollback, ...). Errors those operations return are gRPC
// status errors with the codes a real node gives, so the API layer passes
// them through unchanged.
//
// A machine may be installed with system extensions and from an Image
// Factory schematic (extensions.go): it lists them as ExtensionStatus
// resources (the schematic as Image Factory's virtual extension, and as the
// ImageFactorySchematic resource from 1.14), and an upgrade boots with what
// its installer carries: the factory installer of the machine's schematic
// keeps them, any other installer drops them, as on Talos.
//
// Images come from registries as they are today (images.go): no generic
// installer from Talos 1.14, the Image Factory's installers of any schematic,
// the Kubernetes components of the versions machinery knows; a pull of
// anything else fails as Talos' ImageService fails it (NotFound, containerd's
// "not found"). A cluster's private mirror (mirror.go) serves the
// Kubernetes releases it holds, and its tags list answers from the same rule
// as its pulls. What a machine pulled stays in its containerd store, by
// namespace, across reboots, and LifecycleService.Upgrade installs only an
// installer in that store, as Talos does.
//
// machined's runtime events (runtime_events.go: sequences, phases, tasks
// under the actor ID of the call that started them, MachineStatus changes)
// are kept per boot for MachineService.Events, so that talosctl's reboot and
// upgrade followers follow a machine as they follow Talos.
//
// Faults (package faults) are read on every operation, so a test can switch
// them while the machine runs; every boot is written to the events log
// (component events.Talos, with the running version).
package machine
