package machine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"time"

	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// redacted replaces secrets in the diffs the machine returns.
const redacted = "******"

// metalMode is the runtime mode configs are validated for: a bare-metal
// machine that is already installed, so the config needs no install disk
// (generated configs may have none).
type metalMode struct{}

func (metalMode) String() string        { return "metal" }
func (metalMode) RequiresInstall() bool { return false }
func (metalMode) InContainer() bool     { return false }

// ApplyConfiguration applies a machine config as Talos 1.13's
// MachineService.ApplyConfiguration does, returning the reply message
// without its metadata.
//
//   - The config is parsed with machinery's configloader and validated for a
//     metal machine that is already installed (InvalidArgument otherwise); a change of the machine type
//     between control plane and worker is refused (FailedPrecondition).
//   - The live/reboot rule is Talos' own (CanApplyImmediate): in the v1alpha1
//     document, changes to .debug, everything under .cluster, and under
//     .machine to ca, acceptedCAs, time, certSANs, install, network, sysfs,
//     sysctls, logging, controlPlane, kubelet, kernel, registries, pods,
//     seccompProfiles, nodeAnnotations, nodeLabels, nodeTaints and the features
//     kubernetesTalosAPIAccess, kubePrism, hostDNS, imageCache and
//     nodeAddressSortAlgorithm apply live; any other v1alpha1 change (e.g.
//     machine.type, machine.env, machine.files, machine.disks, machine.token)
//     needs a reboot. Other documents (HostnameConfig, ...) apply live.
//   - NO_REBOOT refuses a change that needs a reboot with InvalidArgument;
//     AUTO picks NO_REBOOT or REBOOT; REBOOT saves the config and reboots into
//     it (no drain, like Talos' reboot sequence); STAGED saves it for the next
//     reboot; TRY answers Unimplemented.
//   - DryRun changes nothing and returns the (secrets-redacted) diff in
//     ModeDetails.
//   - faults.ApplyBlocks (not for a dry run) blocks until ctx ends and changes
//     nothing; faults.UnreachableAfterApply makes the API unreachable that
//     long after a real apply.
//   - A machine that is down answers Unavailable.
func (m *Machine) ApplyConfiguration(ctx context.Context, req *machineapi.ApplyConfigurationRequest) (*machineapi.ApplyConfiguration, error) {
	if !m.isUp() {
		return nil, m.errDown()
	}
	newCfg, err := configloader.NewFromBytes(req.GetData())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to parse config: %v", err)
	}
	warnings, err := newCfg.ValidateAsClient(metalMode{})
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to validate config: %v", err)
	}
	if newCfg.Machine() == nil || newCfg.Cluster() == nil {
		return nil, status.Error(codes.InvalidArgument, "failed to validate config: the v1alpha1 machine and cluster sections are required")
	}
	if newCfg.Machine().Type().IsControlPlane() != m.opts.ControlPlane {
		return nil, status.Errorf(codes.FailedPrecondition, "machine type can't be changed from %s to %s",
			m.State().Config.Machine().Type(), newCfg.Machine().Type())
	}

	if !req.GetDryRun() && m.faults().ApplyBlocks {
		m.log.Info("apply blocks (fault)")
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}

	m.opMu.Lock()
	defer m.opMu.Unlock()
	if !m.isUp() {
		return nil, m.errDown()
	}
	current := m.State().Config

	mode := req.GetMode()
	immediateErr := canApplyImmediate(current, newCfg)
	if mode == machineapi.ApplyConfigurationRequest_AUTO {
		mode = machineapi.ApplyConfigurationRequest_NO_REBOOT
		if immediateErr != nil {
			mode = machineapi.ApplyConfigurationRequest_REBOOT
		}
	}
	var details string
	switch mode {
	case machineapi.ApplyConfigurationRequest_NO_REBOOT:
		if immediateErr != nil {
			return nil, status.Errorf(codes.InvalidArgument, "configuration change can't be applied without a reboot: %v", immediateErr)
		}
		details = "Applied configuration without a reboot"
	case machineapi.ApplyConfigurationRequest_REBOOT:
		details = "Applied configuration with a reboot"
	case machineapi.ApplyConfigurationRequest_STAGED:
		details = "Staged configuration to be applied after the next reboot"
	case machineapi.ApplyConfigurationRequest_TRY:
		return nil, status.Error(codes.Unimplemented, "apply mode TRY is not supported by the simulated machine")
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown apply mode %v", mode)
	}

	if req.GetDryRun() {
		diff, err := configdiff.DiffConfigs(current.RedactSecrets(redacted), newCfg.RedactSecrets(redacted))
		if err != nil {
			return nil, status.Errorf(codes.Internal, "failed to compute config diff: %v", err)
		}
		if diff == "" {
			diff = "No changes."
		}
		return &machineapi.ApplyConfiguration{
			Mode:        mode,
			Warnings:    warnings,
			ModeDetails: fmt.Sprintf("Dry run summary:\n%s (skipped in dry-run).\n\nConfig diff:\n\n%s", details, diff),
		}, nil
	}

	before := m.State()
	switch mode { //nolint:exhaustive // the other modes returned above
	case machineapi.ApplyConfigurationRequest_NO_REBOOT:
		if err := m.setActiveConfig(ctx, newCfg); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to apply config: %v", err)
		}
	case machineapi.ApplyConfigurationRequest_STAGED, machineapi.ApplyConfigurationRequest_REBOOT:
		if err := m.setPersistentConfig(ctx, newCfg); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to save config: %v", err)
		}
	}
	m.log.Info("config applied", "mode", mode.String())
	if d := m.faults().UnreachableAfterApply.Duration; d > 0 {
		m.mu.Lock()
		m.unreachableUntil = time.Now().Add(d)
		m.mu.Unlock()
		m.wg.Add(1)
		go func() { // wake subscribers when the window closes
			defer m.wg.Done()
			select {
			case <-time.After(d):
				m.notify()
			case <-m.ctx.Done():
			}
		}()
	}
	m.notify()
	if wait := m.opts.StaticPodApplyWait; mode == machineapi.ApplyConfigurationRequest_NO_REBOOT && wait > 0 &&
		!maps.Equal(before.StaticPods, m.State().StaticPods) {
		// A control-plane apply that changes a static pod returns only once
		// Talos has restarted it (seen on hardware, seed 001): the caller's
		// deadline must allow for that. The change is made either way.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if mode == machineapi.ApplyConfigurationRequest_REBOOT {
		if err := m.startSequence(sequenceEvents{m: m, name: "reboot", actor: ActorID(ctx)}, false, nil); err != nil {
			return nil, err
		}
	}
	return &machineapi.ApplyConfiguration{Mode: mode, Warnings: warnings, ModeDetails: details}, nil
}

// setActiveConfig makes cfg the active and persistent config, updates the
// COSI resources and bumps ConfigVersion if anything changed. The caller
// holds opMu.
func (m *Machine) setActiveConfig(ctx context.Context, cfg config.Provider) error {
	same, err := sameConfig(m.State().Config, cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.persistent = cfg
	m.st.ConfigStaged = false
	m.mu.Unlock()
	if same {
		return m.putMachineConfig(ctx, configres.PersistentID, cfg)
	}
	kubeletSpec := m.kubeletSpecVersion(ctx)
	if err := m.syncConfig(ctx, cfg, cfg); err != nil {
		return err
	}
	m.mu.Lock()
	m.st.Config = cfg
	m.st.ConfigVersion++
	m.mu.Unlock()
	if m.kubeletSpecVersion(ctx) != kubeletSpec && m.isUp() {
		// Talos' KubeletServiceController restarts the kubelet on any
		// change of its KubeletSpec.
		m.restartService("kubelet", m.opts.KubeletRestart)
	}
	return nil
}

// setPersistentConfig saves cfg for the next boot. The caller holds opMu.
func (m *Machine) setPersistentConfig(ctx context.Context, cfg config.Provider) error {
	same, err := sameConfig(m.State().Config, cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.persistent = cfg
	m.st.ConfigStaged = !same
	m.mu.Unlock()
	return m.putMachineConfig(ctx, configres.PersistentID, cfg)
}

func sameConfig(a, b config.Provider) (bool, error) {
	ab, err := a.Bytes()
	if err != nil {
		return false, fmt.Errorf("encode config: %w", err)
	}
	bb, err := b.Bytes()
	if err != nil {
		return false, fmt.Errorf("encode config: %w", err)
	}
	return string(ab) == string(bb), nil
}

// canApplyImmediate mirrors Talos' Runtime.CanApplyImmediate: it blanks out
// in the new v1alpha1 document every field Talos applies live and reports
// whatever difference remains.
func canApplyImmediate(current, next config.Provider) error {
	cur := current.RawV1Alpha1()
	if cur == nil {
		return errors.New("current config is not v1alpha1")
	}
	nw := next.RawV1Alpha1()
	if nw == nil {
		return errors.New("new config is not v1alpha1")
	}
	nw = nw.DeepCopy()

	nw.ConfigDebug = cur.ConfigDebug
	nw.ClusterConfig = cur.ClusterConfig
	if nw.MachineConfig != nil && cur.MachineConfig != nil {
		nm, cm := nw.MachineConfig, cur.MachineConfig
		nm.MachineCA = cm.MachineCA
		nm.MachineAcceptedCAs = cm.MachineAcceptedCAs
		nm.MachineTime = cm.MachineTime //nolint:staticcheck // mirrors Talos
		nm.MachineCertSANs = cm.MachineCertSANs
		nm.MachineInstall = cm.MachineInstall
		nm.MachineNetwork = cm.MachineNetwork //nolint:staticcheck // mirrors Talos
		nm.MachineSysfs = cm.MachineSysfs
		nm.MachineSysctls = cm.MachineSysctls
		nm.MachineLogging = cm.MachineLogging
		nm.MachineControlPlane = cm.MachineControlPlane
		nm.MachineKubelet = cm.MachineKubelet
		nm.MachineKernel = cm.MachineKernel
		nm.MachineRegistries = cm.MachineRegistries //nolint:staticcheck // mirrors Talos
		nm.MachinePods = cm.MachinePods
		nm.MachineSeccompProfiles = cm.MachineSeccompProfiles
		nm.MachineNodeAnnotations = cm.MachineNodeAnnotations
		nm.MachineNodeLabels = cm.MachineNodeLabels
		nm.MachineNodeTaints = cm.MachineNodeTaints
		if nm.MachineFeatures != nil && cm.MachineFeatures != nil {
			nm.MachineFeatures.KubernetesTalosAPIAccessConfig = cm.MachineFeatures.KubernetesTalosAPIAccessConfig
			nm.MachineFeatures.KubePrismSupport = cm.MachineFeatures.KubePrismSupport
			nm.MachineFeatures.HostDNSSupport = cm.MachineFeatures.HostDNSSupport
			nm.MachineFeatures.ImageCacheSupport = cm.MachineFeatures.ImageCacheSupport
			nm.MachineFeatures.FeatureNodeAddressSortAlgorithm = cm.MachineFeatures.FeatureNodeAddressSortAlgorithm
		}
	}
	if reflect.DeepEqual(cur, nw) {
		return nil
	}
	diff, err := configdiff.DiffConfigs(
		container.NewV1Alpha1(cur).RedactSecrets(redacted),
		container.NewV1Alpha1(nw).RedactSecrets(redacted),
	)
	if err != nil {
		return fmt.Errorf("error calculating diff: %w", err)
	}
	return fmt.Errorf("this config change can't be applied in immediate mode\ndiff:\n%s", diff)
}
