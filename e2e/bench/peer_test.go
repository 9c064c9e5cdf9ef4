package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTimedLines(t *testing.T) {
	var l timedLines

	_, _ = l.Write([]byte("one\ntw"))
	_, _ = l.Write([]byte("o\nthree"))

	var texts []string
	for _, x := range l.lines() {
		texts = append(texts, x.text)
	}

	assert.Equal(t, []string{"one", "two"}, texts, "a line is timed once complete")
	assert.Equal(t, "one\ntwo\nthree", l.raw.String())
}
