#pragma once
// Test hooks of the device configuration (include/kiln/core/device_config.h).
namespace kiln::config::internal {

// Forgets every setting and the environment read so far, and unfreezes every device
// type: the next call re-reads the environment and creates new allocators. Existing
// allocators are retired, not destroyed (tensors still using them stay valid). Not
// thread-safe: only for tests, with no other thread using kiln.
void reset_for_testing();

}  // namespace kiln::config::internal
