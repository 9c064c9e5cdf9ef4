// Package talosapi serves the real Talos gRPC API (machinery's generated
// services and the COSI State API) over mTLS in front of simulated machines,
// one listener per machine on its own address, port 50000, as apid does.
//
// It owns the network side of the simulated Talos nodes:
//   - TLS: a server certificate per machine signed by the Talos OS CA (SANs:
//     the machine's IP and name, talos.default, localhost, 127.0.0.1); a
//     client certificate chaining to the same CA is required.
//   - Authorization: roles come from the client certificate's Organization
//     (machinery's role package). Methods follow Talos' machined rules table
//     (see rules in authz.go; a method not listed needs os:admin), and COSI
//     resources marked Sensitive (MachineConfig, APIServerConfig, KubeletSpec,
//     ...) can be read with os:admin only, as Talos does. Refusals answer
//     PermissionDenied.
//   - Routing, as apid: gRPC metadata "node" (an IP or a hostname) sends the
//     call to that machine in-process whichever endpoint received it; no
//     "node" means the receiving machine. "nodes" with one value is the same
//     as "node"; with several values, unary calls fan out (one message per
//     node, errors embedded in the message metadata as apid does) and
//     streaming calls answer Unimplemented. Unary replies carry
//     Metadata.Hostname, the node as the client named it (the machine's IP
//     when no node was given). An unknown node answers NotFound; a machine
//     that is rebooting or faulted unreachable answers Unavailable.
//   - Reachability: the listener of a machine that is down or faulted
//     unreachable is closed (connections refused, open connections dropped)
//     and reopened when it is back, so clients see the dial errors of a
//     rebooting node. Streams routed through another endpoint to a machine
//     that goes down end with Unavailable.
//   - COSI: each call reads the routed machine's state (the current boot's)
//     through Talos' access policy: writes are refused, and so are a type or
//     a namespace the machine does not register in its meta namespace, all
//     PermissionDenied.
//
// Served: MachineService Version, ApplyConfiguration, ImagePull, Kubeconfig,
// EtcdMemberList, EtcdStatus, EtcdAlarmList, EtcdSnapshot (the real etcd's),
// Upgrade (deprecated), Reboot (both answer the actor ID of the sequence they
// start), Rollback, Events (machined's runtime events, events.go), Read, Logs
// (machined's), ServiceList,
// ServiceStart, ServiceStop, ServiceRestart (the rest answer Unimplemented);
// ImageService.Pull and LifecycleService.Upgrade on a target running Talos
// 1.13 or later (before, machined has neither service: Unimplemented
// "unknown service", as gRPC answers); COSI State Get/List/Watch.
package talosapi
