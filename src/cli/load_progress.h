// Load progress shared by the commands that load a model (serve, run).
#pragma once

#include <string>

namespace hablar::cli {

// Reads the model file once, showing progress on a terminal (stderr): the cost of loading is
// the disk, and the pages stay cached for the mmap that follows.
void warm_file_with_progress(const std::string& path);

}  // namespace hablar::cli
