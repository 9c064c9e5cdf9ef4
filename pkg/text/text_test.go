package text_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

func TestOneLine(t *testing.T) {
	assert.Equal(t, "a b c", text.OneLine("  a\n\tb  c\n"))
	assert.Equal(t, "", text.OneLine("\n"))
}

func TestSummarize(t *testing.T) {
	assert.Equal(t, "a; b; c", text.Summarize([]string{"a", "b", "c"}))
	assert.Equal(t, "a; b; c; and 2 more", text.Summarize([]string{"a", "b", "c", "d", "e"}))
	assert.Equal(t, "", text.Summarize(nil))
}

func TestSummarizeList(t *testing.T) {
	assert.Equal(t, "a, b", text.SummarizeList([]string{"a", "b"}))
	assert.Equal(t, "a, b, c, d, e and 1 more", text.SummarizeList([]string{"a", "b", "c", "d", "e", "f"}))
}
