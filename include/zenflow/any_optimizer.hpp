// zenflow::any_optimizer: one runtime type for every optimizer, so that a trainer can pick ZenFlow,
// ZeRO-Offload or plain AdamW from a command-line flag or a config file and hold the result in one
// variable. The same member functions as zenflow::optimizer; one virtual call each (nothing per
// element), the optimizer itself unchanged behind it.
//
//   auto opt = zenflow::any_optimizer::create(flag, cfg);  // "zenflow", "zero_offload" or "device_adam"
//   opt.add_matrix(...); opt.initialize(); opt.step();
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "optimizer.hpp"

namespace zenflow {

enum class optimizer_kind : std::uint8_t {
  zenflow = 0,       // zenflow::optimizer<Space>: the paper's system
  zero_offload = 1,  // zenflow::zero_offload<Space>: every column on the host, every step
  device_adam = 2,   // zenflow::device_adam<Space>: plain AdamW where the model trains
};

constexpr std::string_view name_of(optimizer_kind k) noexcept {
  switch (k) {
    case optimizer_kind::zenflow: return "zenflow";
    case optimizer_kind::zero_offload: return "zero_offload";
    case optimizer_kind::device_adam: return "device_adam";
  }
  return "?";
}

// The kind a name stands for; anything else throws std::invalid_argument listing the names.
inline optimizer_kind parse_optimizer_kind(std::string_view name) {
  for (optimizer_kind k : {optimizer_kind::zenflow, optimizer_kind::zero_offload, optimizer_kind::device_adam})
    if (name == name_of(k)) return k;
  throw std::invalid_argument("zenflow: unknown optimizer '" + std::string(name) +
                              "' (one of: zenflow, zero_offload, device_adam)");
}

class any_optimizer {
 public:
  // One of the three built-in optimizers on Space (cuda_space from <zenflow/cuda.hpp>).
  template <class Space = host_space>
  static any_optimizer create(optimizer_kind kind, const config& cfg) {
    switch (kind) {
      case optimizer_kind::zenflow: return make<optimizer<Space>>(name_of(kind), cfg);
      case optimizer_kind::zero_offload: return make<zero_offload<Space>>(name_of(kind), cfg);
      case optimizer_kind::device_adam: return make<device_adam<Space>>(name_of(kind), cfg);
    }
    throw std::invalid_argument("zenflow: unknown optimizer kind " + std::to_string(int(kind)));
  }
  template <class Space = host_space>
  static any_optimizer create(std::string_view kind, const config& cfg) {
    return create<Space>(parse_optimizer_kind(kind), cfg);
  }
  // The same, data parallel over `comm` (mpi_communicator on host_space, nccl_communicator on
  // cuda_space): the policies of the three kinds, with Communicator.
  template <class Space, communicator_policy Communicator>
  static any_optimizer create(optimizer_kind kind, const config& cfg, Communicator comm) {
    switch (kind) {
      case optimizer_kind::zenflow:
        return make<optimizer<Space, column_topk, fused_adamw<Space>, simd_accumulator, default_transport_t<Space>,
                              bounded_async, Communicator>>(name_of(kind), cfg, std::move(comm));
      case optimizer_kind::zero_offload:
        return make<zero_offload<Space, Communicator>>(name_of(kind), cfg, std::move(comm));
      case optimizer_kind::device_adam:
        return make<device_adam<Space, Communicator>>(name_of(kind), cfg, std::move(comm));
    }
    throw std::invalid_argument("zenflow: unknown optimizer kind " + std::to_string(int(kind)));
  }
  // The same with the kind by name ("zenflow", "zero_offload", "device_adam"). No collective: a
  // name one rank cannot read throws on that rank only (zf_create_mpi votes on it).
  template <class Space, communicator_policy Communicator>
  static any_optimizer create(std::string_view kind, const config& cfg, Communicator comm) {
    return create<Space>(parse_optimizer_kind(kind), cfg, std::move(comm));
  }
  // Any optimizer type (one's own policies), constructed in place from args; `name` is what
  // name() reports.
  template <class Opt, class... Args>
  static any_optimizer make(std::string_view name, Args&&... args) {
    any_optimizer a;
    a.p_ = std::make_unique<model<Opt>>(std::forward<Args>(args)...);
    a.name_ = std::string(name);
    return a;
  }

  // (A moved-from any_optimizer holds nothing: its calls throw std::logic_error, but for name(),
  // "", initialized() and usable(), false, and applied_steps(), 0.)
  any_optimizer(any_optimizer&&) noexcept = default;
  any_optimizer& operator=(any_optimizer&&) noexcept = default;
  ~any_optimizer() = default;

  std::string_view name() const noexcept { return name_; }

  matrix_id add_matrix(const matrix_param& p) { return impl().add_matrix(p); }
  vector_id add_vector(const vector_param& p) { return impl().add_vector(p); }
  // On the stream the optimizer already has (cuda_space: the default stream until one is given;
  // the one an earlier call gave), as optimizer::initialize() and step(grad_scale) do.
  void initialize() { impl().initialize_here(); }
  // With the space's stream (a cudaStream_t on cuda_space, passed as void*; nullptr is then the
  // default stream); a space without streams (host_space) takes only nullptr.
  void initialize(void* stream) { impl().initialize(stream); }
  step_info step(float grad_scale = 1.0f) { return impl().step_here(grad_scale); }
  step_info step(void* stream, float grad_scale = 1.0f) { return impl().step(stream, grad_scale); }
  void synchronize() { impl().synchronize(); }
  void set_lr(float lr) { impl().set_lr(lr); }
  float lr() const { return impl().lr(); }
  const config& get_config() const { return impl().get_config(); }
  bool initialized() const noexcept { return p_ && p_->initialized(); }
  // optimizer::usable(): false once a call failed midway, until a load succeeds.
  bool usable() const noexcept { return p_ && p_->usable(); }
  std::uint64_t applied_steps() const noexcept { return p_ ? p_->applied_steps() : 0; }
  optimizer_stats stats() const { return impl().stats(); }
  // optimizer::all_agree: data parallel, a vote of the ranks (a collective); one process, ok.
  bool all_agree(bool ok) { return impl().all_agree(ok); }

  void copy_master(matrix_id m, float* out) { impl().copy_master(m, out); }
  void copy_exp_avg(matrix_id m, float* out) { impl().copy_exp_avg(m, out); }
  void copy_exp_avg_sq(matrix_id m, float* out) { impl().copy_exp_avg_sq(m, out); }
  std::vector<std::uint32_t> column_counts(matrix_id m) { return impl().column_counts(m); }
  std::vector<std::uint32_t> selected_columns(matrix_id m) const { return impl().selected_columns(m); }
  void copy_vector_master(vector_id v, float* out) { impl().copy_vector_master(v, out); }
  void copy_params_synchronized(matrix_id m, void* out) { impl().copy_params_synchronized(m, out); }

  void save(const std::string& path) { impl().save(path); }
  void load(const std::string& path) { impl().load(path); }
  void load_image(const void* data, std::size_t size, const std::string& name = "(memory)") {
    impl().load_image(data, size, name);
  }

 private:
  any_optimizer() = default;

  struct iface {
    virtual ~iface() = default;
    virtual matrix_id add_matrix(const matrix_param&) = 0;
    virtual vector_id add_vector(const vector_param&) = 0;
    virtual void initialize(void* stream) = 0;
    virtual void initialize_here() = 0;
    virtual step_info step(void* stream, float grad_scale) = 0;
    virtual step_info step_here(float grad_scale) = 0;
    virtual bool usable() const noexcept = 0;
    virtual void synchronize() = 0;
    virtual void set_lr(float) = 0;
    virtual float lr() const noexcept = 0;
    virtual const config& get_config() const noexcept = 0;
    virtual bool initialized() const noexcept = 0;
    virtual std::uint64_t applied_steps() const noexcept = 0;
    virtual optimizer_stats stats() const = 0;
    virtual bool all_agree(bool) = 0;
    virtual void copy_master(matrix_id, float*) = 0;
    virtual void copy_exp_avg(matrix_id, float*) = 0;
    virtual void copy_exp_avg_sq(matrix_id, float*) = 0;
    virtual std::vector<std::uint32_t> column_counts(matrix_id) = 0;
    virtual std::vector<std::uint32_t> selected_columns(matrix_id) const = 0;
    virtual void copy_vector_master(vector_id, float*) = 0;
    virtual void copy_params_synchronized(matrix_id, void*) = 0;
    virtual void save(const std::string&) = 0;
    virtual void load(const std::string&) = 0;
    virtual void load_image(const void*, std::size_t, const std::string&) = 0;
  };

  template <class Opt>
  struct model final : iface {
    template <class... Args>
    explicit model(Args&&... args) : o(std::forward<Args>(args)...) {}
    Opt o;

    using stream_type = typename std::remove_reference_t<decltype(o.space())>::stream_type;
    static constexpr bool has_streams = std::is_pointer_v<stream_type>;
    // A space without streams accepts only nullptr; the refusal goes through the optimizer (data
    // parallel: the call's vote), so that every rank refuses the call, none waiting in it.
    static constexpr const char* no_streams = "this optimizer's space has no streams; pass no stream";

    matrix_id add_matrix(const matrix_param& p) override { return o.add_matrix(p); }
    vector_id add_vector(const vector_param& p) override { return o.add_vector(p); }
    void initialize(void* s) override {
      if constexpr (has_streams) {
        o.initialize(static_cast<stream_type>(s));
      } else {
        if (s) o.refuse_initialize(no_streams);
        o.initialize();
      }
    }
    void initialize_here() override { o.initialize(); }
    step_info step(void* s, float grad_scale) override {
      if constexpr (has_streams) {
        return o.step(static_cast<stream_type>(s), grad_scale);
      } else {
        if (s) o.refuse_step(no_streams);
        return o.step(grad_scale);
      }
    }
    step_info step_here(float grad_scale) override { return o.step(grad_scale); }
    bool usable() const noexcept override { return o.usable(); }
    void synchronize() override { o.synchronize(); }
    void set_lr(float lr) override { o.set_lr(lr); }
    float lr() const noexcept override { return o.lr(); }
    const config& get_config() const noexcept override { return o.get_config(); }
    bool initialized() const noexcept override { return o.initialized(); }
    std::uint64_t applied_steps() const noexcept override { return o.applied_steps(); }
    optimizer_stats stats() const override { return o.stats(); }
    bool all_agree(bool ok) override { return o.all_agree(ok); }
    void copy_master(matrix_id m, float* out) override { o.copy_master(m, out); }
    void copy_exp_avg(matrix_id m, float* out) override { o.copy_exp_avg(m, out); }
    void copy_exp_avg_sq(matrix_id m, float* out) override { o.copy_exp_avg_sq(m, out); }
    std::vector<std::uint32_t> column_counts(matrix_id m) override { return o.column_counts(m); }
    std::vector<std::uint32_t> selected_columns(matrix_id m) const override { return o.selected_columns(m); }
    void copy_vector_master(vector_id v, float* out) override { o.copy_vector_master(v, out); }
    void copy_params_synchronized(matrix_id m, void* out) override { o.copy_params_synchronized(m, out); }
    void save(const std::string& path) override { o.save(path); }
    void load(const std::string& path) override { o.load(path); }
    void load_image(const void* d, std::size_t n, const std::string& name) override { o.load_image(d, n, name); }
  };

  iface& impl() const {
    if (!p_) throw std::logic_error("zenflow: this any_optimizer was moved from");
    return *p_;
  }

  std::unique_ptr<iface> p_;
  std::string name_;
};

}  // namespace zenflow
