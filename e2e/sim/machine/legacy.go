package machine

import (
	"context"
	"errors"
	"fmt"
	"time"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// The services of a Talos API by the version that brought them. Talos 1.13
// added ImageService (List, Pull, Import, Remove, Verify) and
// LifecycleService (Install, Upgrade) next to MachineService
// (api/machine/image.proto and lifecycle.proto first appear in v1.13.0); on
// an older Talos machined does not register them and gRPC answers a call to
// one with Unimplemented "unknown service machine.LifecycleService". A Talos
// endpoint (apid) proxies any method to the target node, so it is the
// target's version that decides.
var serviceSince = map[string]int{
	"machine.ImageService":     13,
	"machine.LifecycleService": 13,
}

// Serves tells whether the machine's running Talos serves the gRPC service
// (its full name, e.g. "machine.LifecycleService").
func (m *Machine) Serves(service string) bool {
	since, ok := serviceSince[service]
	if !ok {
		return true
	}
	m.mu.Lock()
	version := m.st.TalosVersion
	m.mu.Unlock()
	return talosMinor(version) >= since
}

// legacyPhases is the number of phases of Talos' upgrade sequence: drain,
// cleanup, dbus, stopServices, unmount, unmountBind, unmountSystem,
// volumeFinalize, upgrade, meta, kexec (reboot mode DEFAULT only),
// stopEverything, reboot.
func legacyPhases(req *machineapi.UpgradeRequest) int {
	if req.GetRebootMode() == machineapi.UpgradeRequest_DEFAULT {
		return 13
	}
	return 12
}

// Upgrade is MachineService.Upgrade, the only upgrade call before Talos
// 1.13 and deprecated since, as Talos 1.12 and 1.13 run it
// (internal/app/machined/internal/server/v1alpha1 Server.Upgrade and the
// Upgrade sequence). In the call, before any answer: the request is logged,
// the installer image is pulled and validated (a pull that fails fails the
// call: "error validating installer image"), and on a control plane, unless
// force (or, from 1.13, preserve), etcdCheck runs: Talos' etcd checks (an
// etcd of two members, a member not started or not answering fails the call:
// "error validating etcd for upgrade"). Then the call answers at once with an
// ack and the upgrade sequence runs in the background, whatever becomes of
// the caller: Talos cordons and drains the node (BeforeReboot), installs the
// new version into the other boot slot and reboots into it. A sequence
// already under way on the machine (an upgrade, a reboot) makes the new one
// fail in the background ("upgrade failed: locked" in machined's log): the
// call still answers the ack, and nothing is installed. With stage, the
// sequence reboots without draining; the install runs at the next boot,
// which reboots again into the new version (the simulator installs while
// the machine is down and boots once: one new boot ID, where Talos shows a
// short boot in between). The reboot mode (POWERCYCLE: no kexec) changes
// nothing here.
//
// Faults (faults.Node): pullFails fails the call; installHangs holds the
// sequence after its install, before its reboot, while the fault is set
// (the caller has had its answer long before: the node stays up, cordoned,
// its new version installed, in the same boot); etcdStopped on any control
// plane fails a control plane's call in etcdCheck. The caller's
// upgradeUnavailable is the API's (package talosapi).
//
// Simplified: Talos stops the node's pods and services (etcd, the kubelet)
// before the install; the simulator keeps them until the reboot.
func (m *Machine) Upgrade(ctx context.Context, req *machineapi.UpgradeRequest, etcdCheck func(ctx context.Context) error) error {
	if !m.isUp() {
		return m.errDown()
	}
	image := req.GetImage()
	m.logMachined(fmt.Sprintf("upgrade request received: staged %v, force %v, reboot mode %v", req.GetStage(), req.GetForce(), req.GetRebootMode()))
	m.logMachined(fmt.Sprintf("validating %q", image))
	version, err := InstallerVersion(image)
	if err != nil {
		return status.Errorf(codes.Unknown, "error validating installer image %q: %v", image, err)
	}
	// Talos pulls it into the system namespace itself (PullAndValidateInstallerImage)
	// and returns the pull's error wrapped, as a plain error: gRPC Unknown.
	if _, err := m.pull(ctx, NamespaceSystem, image); err != nil {
		var nf *imageNotFoundError
		if st, ok := status.FromError(err); errors.As(err, &nf) || (ok && st.Code() == codes.Unknown) {
			return status.Errorf(codes.Unknown, "error validating installer image %q: %s", image, status.Convert(err).Message())
		}
		return err
	}
	m.mu.Lock()
	running := m.st.TalosVersion
	m.mu.Unlock()
	skipEtcd := req.GetForce() || (talosMinor(running) >= 13 && req.GetPreserve())
	if m.opts.ControlPlane && !skipEtcd && etcdCheck != nil {
		if err := etcdCheck(ctx); err != nil {
			return status.Errorf(codes.Unknown, "error validating etcd for upgrade: %s", status.Convert(err).Message())
		}
	}

	m.mu.Lock()
	if !m.st.Up {
		m.mu.Unlock()
		return m.errDown()
	}
	locked := m.rebooting
	if !locked {
		m.rebooting = true
		if req.GetStage() {
			m.stagedImage = image
		}
	}
	m.mu.Unlock()
	if locked {
		// The sequence fails to take the lock, in the background; the call
		// has its ack.
		m.logMachined("upgrade failed: locked")
		m.lockedSequence("upgrade")
		return nil
	}
	if req.GetStage() {
		m.log.Info("upgrade staged for the next boot", "version", version, "image", image)
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.runSequence(sequenceEvents{m: m, name: "stageUpgrade", actor: ActorID(ctx)}, false, nil)
		}()
		return nil
	}
	m.logMachined(fmt.Sprintf("upgrade sequence: %d phase(s)", legacyPhases(req)))
	seq := sequenceEvents{m: m, name: "upgrade", actor: ActorID(ctx)}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.runSequence(seq, true, func(ctx context.Context) error {
			return m.legacyInstall(ctx, image, version, req)
		})
	}()
	return nil
}

// legacyInstall is the upgrade phase of the upgrade sequence: the installer
// (pulled by the call) installs the version into the other boot slot; under
// installHangs the sequence then holds until the fault is cleared.
func (m *Machine) legacyInstall(ctx context.Context, image, version string, req *machineapi.UpgradeRequest) error {
	task := fmt.Sprintf("task upgrade (9/%d): ", legacyPhases(req))
	m.logMachined(fmt.Sprintf("phase upgrade (9/%d): 1 tasks(s)", legacyPhases(req)))
	m.logMachined(task + fmt.Sprintf("performing upgrade via %q", image))
	if err := m.installSlot(ctx, image, version); err != nil {
		m.logMachined("upgrade sequence: failed")
		m.logMachined(fmt.Sprintf("upgrade failed: %v", err))
		return err
	}
	m.logMachined(task + "upgrade successful")
	for m.faults().InstallHangs {
		m.log.Info("upgrade sequence holds after its install (fault)", "version", version)
		select {
		case <-time.After(faultPollInterval):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// installSlot installs version from image into the other boot slot: the
// machine takes it at its next boot.
func (m *Machine) installSlot(ctx context.Context, image, version string) error {
	m.opts.Events.Start(m.opts.Name, events.TalosInstall, version)
	m.opMu.Lock()
	defer m.opMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	m.st.StagedVersion = version
	m.st.InstallerImage = image
	m.st.StagedExtensions = installerExtensions(image, m.st.Extensions)
	m.log.Info("upgrade staged", "version", version, "image", image)
	return nil
}

// installStaged runs, while the machine is down, the install a staged
// upgrade left for its next boot (Talos' Install sequence at boot, then a
// second reboot).
func (m *Machine) installStaged(ctx context.Context) {
	m.mu.Lock()
	image := m.stagedImage
	m.stagedImage = ""
	m.mu.Unlock()
	if image == "" {
		return
	}
	version, err := InstallerVersion(image)
	if err != nil {
		m.log.Error("staged upgrade", "err", err)
		return
	}
	if err := m.installSlot(ctx, image, version); err != nil {
		m.log.Error("staged upgrade", "err", err)
		return
	}
	select {
	case <-time.After(m.opts.RebootDelay):
	case <-ctx.Done():
	}
}
