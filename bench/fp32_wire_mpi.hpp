// mpi_communicator without its typed members, for side-by-side runs: an optimizer over it widens
// every gradient to fp32 for the reduction and rounds the result back itself (what it does with a
// communicator that has only the fp32 members), where over mpi_communicator the gradients travel
// in their own dtype. The same bits either way; the bytes and times differ.
#pragma once

#include <zenflow/mpi.hpp>

namespace zf_bench {

struct fp32_wire_mpi : zenflow::mpi_communicator {
  using zenflow::mpi_communicator::mpi_communicator;
  void reduce(void*, zenflow::dtype, std::size_t, zenflow::reduce_op) = delete;
  void reduce_scatter(void*, zenflow::dtype, const std::size_t*, zenflow::reduce_op) = delete;
  using zenflow::mpi_communicator::reduce;
  using zenflow::mpi_communicator::reduce_scatter;
};

}  // namespace zf_bench
