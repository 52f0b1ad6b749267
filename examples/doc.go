// Package examples holds runnable example services for idem.
package examples
