package render

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
)

// Hash returns a stable hash of a machine config: the hex sha256 of its
// canonical encoding (every document re-encoded from its fields, without
// comments). Formatting and comments of the bytes the config was loaded from
// do not count, so the hash of a node's active config equals the hash of the
// render that was applied to it.
func Hash(cfg config.Provider) (string, error) {
	if cfg == nil {
		return "", errors.New("hash: no machine config")
	}

	b, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		return "", fmt.Errorf("hash: encode the machine config: %w", err)
	}

	sum := sha256.Sum256(b)

	return hex.EncodeToString(sum[:]), nil
}

// Diff returns a unified diff of two machine configs for people to read, with
// secrets redacted on both sides; "" when they encode the same.
func Diff(before, after config.Provider) (string, error) {
	if before == nil || after == nil {
		return "", errors.New("diff: no machine config")
	}

	const redacted = "REDACTED"

	d, err := configdiff.DiffConfigs(before.RedactSecrets(redacted), after.RedactSecrets(redacted))
	if err != nil {
		return "", fmt.Errorf("diff: %w", err)
	}

	return d, nil
}
