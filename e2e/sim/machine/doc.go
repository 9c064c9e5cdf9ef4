// Package machine simulates one Talos Linux machine with Talos 1.13
// semantics: its machine config and the rule deciding which changes apply
// without a reboot, its running and staged (A/B) Talos version, its boot ID,
// reboots, image pulls, and the COSI resources Talos derives from the config
// (MachineConfig, APIServerConfig, ControllerManagerConfig, SchedulerConfig,
// KubeletSpec, the kubelet Service, StaticPods, Manifests, ManifestStatus,
// Nodename, MachineStatus), held in an in-memory COSI state with machinery's
// real resource types.
//
// It owns no network listener: package talosapi serves the Talos gRPC API in
// front of a Machine and calls the operations here (ApplyConfiguration, Pull,
// StageUpgrade, Upgrade, Reboot, ...). Errors those operations return are gRPC
// status errors with the codes a real node gives, so the API layer passes
// them through unchanged.
//
// Faults (package faults) are read on every operation, so a test can switch
// them while the machine runs; every boot is written to the events log
// (component events.Talos, with the running version).
package machine
